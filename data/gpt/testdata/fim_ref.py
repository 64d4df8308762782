#!/usr/bin/env python3
"""Golden FIM samples from Megatron-LM's own GPTFIMDataset code.

Usage: fim_ref.py MEGATRON_FIM_DATASET_PY VOCAB_JSON MERGES_TXT > fim_golden.json

MEGATRON_FIM_DATASET_PY is megatron/training/datasets/fim_dataset.py of
Megatron-LM (d98e8a6: `git show HEAD:megatron/training/datasets/fim_dataset.py`);
VOCAB_JSON and MERGES_TXT are GPT-2's (`gotron tokenizer export-gpt2 DIR`).
The file's GPTFIMDataset class is executed unchanged, with its base class and
imports stubbed: each raw sample is served as one document by
_query_document_sample_shuffle_indices, called in order on one dataset, so the
random stream advances as in Megatron's data loader with --num-workers 0.
The tokenizer is GPT-2's byte-level BPE as Hugging Face's GPT2Tokenizer
(OpenAI's encoder.py; the pre-tokenizer pattern with Python's re, exact for
the texts below), with <|endoftext|> as its one special token.
"""
import json
import sys
import types
from dataclasses import dataclass
import re

import numpy as np

src_path, vocab_path, merges_path = sys.argv[1:4]

# --- GPT-2 tokenizer (Hugging Face GPT2Tokenizer semantics) -------------------
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))

encoder = json.load(open(vocab_path))
decoder = {v: k for k, v in encoder.items()}
merges = [tuple(l.split()) for l in open(merges_path, encoding="utf-8").read().split("\n")[1:] if l.strip()]
ranks = dict(zip(merges, range(len(merges))))
b2u = bytes_to_unicode()
u2b = {v: k for k, v in b2u.items()}
pat = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")
EOT = "<|endoftext|>"


def bpe(token):
    word = tuple(token)
    while len(word) > 1:
        pairs = set(zip(word, word[1:]))
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        first, second = best
        new, i = [], 0
        while i < len(word):
            try:
                j = word.index(first, i)
            except ValueError:
                new.extend(word[i:])
                break
            new.extend(word[i:j])
            i = j
            if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                new.append(first + second)
                i += 2
            else:
                new.append(word[i])
                i += 1
        word = tuple(new)
    return word


class GPT2:
    all_special_tokens = [EOT]

    def text_to_ids(self, text):
        assert EOT not in text
        ids = []
        for tok in pat.findall(text):
            tok = "".join(b2u[b] for b in tok.encode("utf-8"))
            ids.extend(encoder[t] for t in bpe(tok))
        return ids

    def tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return encoder.get(tokens, encoder[EOT])  # unk_token is <|endoftext|>
        return [encoder.get(t, encoder[EOT]) for t in tokens]

    def ids_to_text(self, ids, remove_special_tokens=None):
        toks = [decoder[int(i)] for i in ids]
        if remove_special_tokens:
            toks = [t for t in toks if t not in self.all_special_tokens]
        return bytearray(u2b[c] for c in "".join(toks)).decode("utf-8", errors="replace")


# --- Megatron's fim_dataset.py with its imports stubbed -----------------------
@dataclass
class GPTDatasetConfig:
    random_seed: int = 0
    tokenizer: object = None


class GPTDataset:
    def __init__(self, *a, **k):
        raise AssertionError("not used")


mods = {
    "megatron": types.ModuleType("megatron"),
    "megatron.core": types.ModuleType("megatron.core"),
    "megatron.core.datasets": types.ModuleType("megatron.core.datasets"),
    "megatron.core.datasets.gpt_dataset": types.ModuleType("megatron.core.datasets.gpt_dataset"),
    "megatron.core.datasets.indexed_dataset": types.ModuleType("megatron.core.datasets.indexed_dataset"),
    "megatron.core.datasets.utils": types.ModuleType("megatron.core.datasets.utils"),
}
mods["megatron.core.datasets.gpt_dataset"].GPTDataset = GPTDataset
mods["megatron.core.datasets.gpt_dataset"].GPTDatasetConfig = GPTDatasetConfig
mods["megatron.core.datasets.indexed_dataset"].IndexedDataset = object
mods["megatron.core.datasets.utils"].Split = object
sys.modules.update(mods)
fim = types.ModuleType("fim_dataset")
exec(compile(open(src_path).read(), src_path, "exec"), fim.__dict__)


class Docs:
    def __init__(self, docs):
        self.docs = docs

    def get(self, idx, offset=0, length=None):
        d = self.docs[idx]
        if length is None:
            length = len(d) - offset
        return d[offset:offset + length]


def run(case, raw):
    tok = types.SimpleNamespace(_tokenizer=GPT2())
    cfg = fim.GPTFIMDatasetConfig(
        random_seed=case["seed"], tokenizer=tok, fim_rate=case["rate"], fim_spm_rate=case["spm_rate"],
        fim_extra_tokens=case["tokens"], fim_split_sample=case.get("split_sample"),
        fim_fragment_rate=case.get("fragment_rate"), fim_no_prefix=case.get("no_prefix"))
    ds = object.__new__(fim.GPTFIMDataset)
    ds.config = cfg
    # GPTFIMDataset.__init__ after super().__init__ (which only builds the indices):
    init = fim.GPTFIMDataset.__init__
    base = fim.GPTDataset.__init__
    fim.GPTDataset.__init__ = lambda self, *a, **k: None
    init(ds, None, None, None, 0, None, cfg)
    fim.GPTDataset.__init__ = base
    ds.dataset = Docs([np.array(r, dtype=np.int64) for r in raw])
    ds.shuffle_index = np.arange(len(raw))
    ds.document_index = np.arange(len(raw))
    out = []
    for k, r in enumerate(raw):
        ds.sample_index = {k: (k, 0), k + 1: (k, len(r) - 1)}
        text, _, _ = ds._query_document_sample_shuffle_indices(k)
        out.append([int(x) for x in text])
    return out


g = GPT2()
texts = [
    "def add(a, b):\n    return a + b\n\n\nprint(add(2, 3))\n",
    "Héllo wörld, ça va? 日本語のテキスト and emoji 🚀🔥 mixed in.\n\nSecond paragraph here.",
    "import os\n\nclass Thing:\n    pass\n\nimport sys\nx = [i * i for i in range(10)]\n",
    "The quick brown fox jumps over the lazy dog. " * 3 + "🙂 end",
    "short",
]
docs = []
for t in texts:
    docs.extend(g.text_to_ids(t) + [encoder[EOT]])
# raw samples of seq_length+1 = 33 tokens over the concatenated documents,
# starting at odd offsets, so that samples cut documents and multi-byte
# characters (emoji are several byte-level tokens).
L = 33
raw = [docs[o:o + L] for o in range(0, len(docs) - L, 7)]
raw.append([encoder[EOT]] * 3 + docs[:L - 3])  # empty segments between EODs

sentinels = {"prefix": "@@", "middle": "##", "suffix": "$$", "pad": "~~", "eod": EOT}
for k, v in sentinels.items():
    assert v in encoder, v
cases = [
    {"name": "psm_spm", "seed": 1234, "rate": 0.9, "spm_rate": 0.5, "tokens": sentinels},
    {"name": "spm_only", "seed": 7, "rate": 1.0, "spm_rate": 1.0, "tokens": sentinels},
    {"name": "psm_only", "seed": 0, "rate": 1.0, "spm_rate": 1e-9, "tokens": sentinels},
    {"name": "rare", "seed": 4294967295, "rate": 0.1, "spm_rate": 0.5, "tokens": sentinels},
    {"name": "split_fragments", "seed": 1234, "rate": 0.8, "spm_rate": 0.5, "tokens": sentinels,
     "split_sample": "ĊĊ", "fragment_rate": 0.6},
    {"name": "no_prefix", "seed": 99, "rate": 1.0, "spm_rate": 0.5, "tokens": sentinels,
     "split_sample": "ĊĊ", "fragment_rate": 1.0, "no_prefix": "import"},
]
out = {"megatron": "d98e8a6 megatron/training/datasets/fim_dataset.py", "samples": raw, "cases": []}
for c in cases:
    c = dict(c)
    c["want"] = run(c, raw)
    c["token_ids"] = {k: encoder[v] for k, v in c["tokens"].items()}
    if "split_sample" in c:
        c["split_sample_id"] = encoder[c["split_sample"]]
    out["cases"].append(c)
json.dump(out, sys.stdout, ensure_ascii=False)
print()
