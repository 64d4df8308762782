#!/usr/bin/env python3
"""Writes ckpt/safetensors/testdata/fixture.safetensors (and a JSON description
of its tensors) exactly as the upstream `safetensors` library serializes, built
by hand with struct/json because the library is not installed here:

  * tensors sorted by descending dtype (the Rust enum order, i.e. decreasing
    alignment), then by name (byte order);
  * header = serde_json compact JSON: {"__metadata__":{...},"name":{"dtype":..,
    "shape":[..],"data_offsets":[b,e]},...}, no spaces, non-ASCII unescaped;
  * header padded with spaces to a multiple of 8 bytes; u64 LE length prefix.

Tensor values come from torch (bf16/f16 rounding done by torch).
Run: /usr/bin/python3 tools/golden/safetensors_fixture.py
"""
import json
import os
import struct

import numpy as np
import torch

# The upstream Rust Dtype enum, in declaration order.
ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3",
         "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16",
         "I32", "U32", "F32", "C64", "F64", "I64", "U64"]


def raw(t):
    """Little-endian bytes of a tensor (bf16 via an int16 view)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().numpy().tobytes()


def main():
    base = torch.arange(-3, 9, dtype=torch.float32) * 0.7  # 12 values
    tensors = {
        "model.embed.weight": ("F32", [3, 4], raw(base.reshape(3, 4))),
        "model.layers.0.bf16": ("BF16", [2, 3], raw(base[:6].reshape(2, 3).to(torch.bfloat16))),
        "model.layers.0.f16": ("F16", [5], raw(base[:5].to(torch.float16))),
        "model.layers.0.f64": ("F64", [2], raw(base[:2].to(torch.float64))),
        "steps": ("I64", [], raw(torch.tensor(123456789012, dtype=torch.int64))),
        "ids": ("I32", [3], raw(torch.tensor([-1, 0, 70000], dtype=torch.int32))),
        "shorts": ("I16", [2], raw(torch.tensor([-2, 300], dtype=torch.int16))),
        "bytes": ("I8", [3], raw(torch.tensor([-128, 0, 127], dtype=torch.int8))),
        "ubytes": ("U8", [2, 2], raw(torch.tensor([[0, 1], [254, 255]], dtype=torch.uint8))),
        "mask": ("BOOL", [3], raw(torch.tensor([True, False, True]))),
        "fp8.e4m3": ("F8_E4M3", [2], bytes([0x38, 0xB8])),  # 1.0, -1.0 (no torch 1.13 fp8)
        "fp8.e5m2": ("F8_E5M2", [2], bytes([0x3C, 0xBC])),
        "empty": ("F32", [0, 4], b""),
        "naïve \"quoted\"\n": ("U8", [1], b"\x07"),  # escaping: serde_json style
    }
    rank = {d: i for i, d in enumerate(ORDER)}
    names = sorted(tensors, key=lambda n: (-rank[tensors[n][0]], n.encode()))
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for n in names:
        dtype, shape, data = tensors[n]
        header[n] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    js = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    js += b" " * (-len(js) % 8)
    here = os.path.join(os.path.dirname(__file__), "..", "..", "ckpt", "safetensors", "testdata")
    with open(os.path.join(here, "fixture.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + b"".join(tensors[n][2] for n in names))
    # The same tensors in a form the Go test can read independently.
    desc = {n: {"dtype": d, "shape": s, "hex": b.hex()} for n, (d, s, b) in tensors.items()}
    with open(os.path.join(here, "fixture.json"), "w") as f:
        json.dump(desc, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    # An index as transformers writes it: json.dumps(indent=2, sort_keys=True) + "\n".
    index = {"metadata": {"total_size": 1234, "total_parameters": 617},
             "weight_map": {"b.weight": "model-00002-of-00002.safetensors",
                            "a.weight": "model-00001-of-00002.safetensors",
                            "caf\u00e9 <&> \U0001F600": "model-00001-of-00002.safetensors"}}
    with open(os.path.join(here, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
