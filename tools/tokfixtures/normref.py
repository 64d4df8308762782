#!/usr/bin/env python3
"""Writes tokenizer/testdata/norm.json: strings and their NFC/NFD/NFKC/NFKD
forms by Python's unicodedata, the reference for the tokenizer package's
normalization. Usage: python3 tools/tokfixtures/normref.py > tokenizer/testdata/norm.json"""
import json, random, unicodedata

rng = random.Random(7)
fixed = [
    "Café naïve résumé", "e\u0301\u0323", "\u1e0b\u0323", "q\u0307\u0323", "\u0958\u0959", "\u2126 \u212b \u212a",
    "ﬁ ﬂ ² ½ ㎏ ①", "한국어 텍스트", "\u1100\u1161\u11a8", "\u1100\u1161", "Tiếng Việt có dấu", "Ǆ ǅ ǆ",
    "\u0041\u030a\u0301", "\u00c5\u0301", "\u0f73\u0f75\u0f81", "\u0344", "\u0345\u0301", "ｶﾀｶﾅ ｱｲｳ", "x\u0308\u0301\u0316",
    "\u05d0\u05b8\u05bc", "\u0627\u0653\u0654", "\u1e9b\u0323", "\U0001d15e\U0001d165", "\u3071\u3099", "\u304b\u3099",
]
bases = [c for c in "aeiouAEIOUnczsgkLRyYwW" ] + ["\u0627", "\u05d0", "\u3042", "\u1100", "\uac00", "\u0915"]
marks = [chr(c) for c in list(range(0x300, 0x370)) + [0x1dc0, 0x20d0, 0x5b0, 0x5bc, 0x64b, 0x653, 0x654, 0x93c, 0x94d, 0x3099, 0x309a, 0x1161, 0x11a8]]
for _ in range(300):
    s = "".join(rng.choice(bases) + "".join(rng.choice(marks) for _ in range(rng.randrange(4))) for _ in range(rng.randrange(1, 5)))
    fixed.append(s)
# every code point with a decomposition, in chunks
decomposable = [chr(c) for c in range(0x110000) if not 0xd800 <= c <= 0xdfff and unicodedata.normalize("NFKD", chr(c)) != chr(c)]
for i in range(0, len(decomposable), 64):
    fixed.append("".join(decomposable[i:i + 64]))
out = [{"in": s, "NFC": unicodedata.normalize("NFC", s), "NFD": unicodedata.normalize("NFD", s),
        "NFKC": unicodedata.normalize("NFKC", s), "NFKD": unicodedata.normalize("NFKD", s)} for s in fixed]
print(json.dumps(out, ensure_ascii=False))
