class ByteStub:
    vocab_size = 257
    eod = 256
    def tokenize(self, text):
        return list(text.encode("utf-8"))

def build_tokenizer(args):
    return ByteStub()
