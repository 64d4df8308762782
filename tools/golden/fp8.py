#!/usr/bin/python3
"""Goldens for internal/fp8: the FP8 casts and Transformer Engine's scale rules.

Usage (repository root; Debian's python3-torch 1.13, CPU, which has no float8):

    /usr/bin/python3 tools/golden/fp8.py > internal/fp8/testdata/golden.json
    go test ./internal/fp8 -run Golden

Independent of the Go code, written from the format definitions:

- decode: every one of the 256 codes of OCP FP8 E4M3 (bias 7, no infinity,
  S.1111.111 NaN) and E5M2 (bias 15, IEEE-like), from the bit layout with
  exact rationals;
- encode: the cast as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)
  (TE's static_cast to fp8) defines it, by searching all finite codes for the
  nearest value (exact rationals; on a tie the code with an even mantissa,
  i.e. an even code), magnitudes above the largest finite value (inf
  included) saturating to it, NaN giving 0x7F, the sign kept (-0 stays -0);
  inputs: every code's value, every midpoint between neighbouring values and
  the float32 neighbours of each midpoint, values around the largest finite
  value and below the smallest subnormal, signed zeros, infinities, NaN and
  random float32s;
- current scale: TE's compute_scale_from_amax (recipe_common.cuh) written in
  torch float32;
- delayed scale: TE's former Python amax_and_scale_update
  (_default_get_amax_and_update_history + _default_sf_compute: torch.roll of
  the history by -1, [0] zeroed, scale = (fp8_max / amax) / 2**margin where
  amax is finite and positive, else kept), in torch float32, with the inf
  guard of today's delayed_scaling.cu (an overflowing scale becomes the
  largest float32).

Float32 values are written as their bits (hex) so that the JSON is exact.
"""
import json
import random
import struct
from fractions import Fraction

import torch

FORMATS = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}


def f32bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bits_f32(b):
    return struct.unpack("<f", struct.pack("<I", b))[0]


def decode(name, code):
    """Exact value (Fraction), or 'nan' / '+inf' / '-inf'."""
    eb, mb, bias = FORMATS[name]
    sign = -1 if code & 0x80 else 1
    e = (code >> mb) & ((1 << eb) - 1)
    m = code & ((1 << mb) - 1)
    if e == (1 << eb) - 1:
        if name == "e4m3" and m == (1 << mb) - 1:
            return "nan"
        if name == "e5m2":
            if m == 0:
                return "+inf" if sign > 0 else "-inf"
            return "nan"
    if e == 0:
        v = Fraction(m, 1 << mb) * Fraction(2) ** (1 - bias)
    else:
        v = (1 + Fraction(m, 1 << mb)) * Fraction(2) ** (e - bias)
    return sign * v


def finite_codes(name):
    """(value, code) for the non-negative finite codes (sign bit clear)."""
    out = []
    for c in range(0x80):
        v = decode(name, c)
        if not isinstance(v, str):
            out.append((v, c))
    return out


def encode(name, x):
    if x != x:
        return 0x7F
    neg = struct.unpack("<I", struct.pack("<f", x))[0] >> 31
    sign = 0x80 if neg else 0
    if x in (float("inf"), float("-inf")):
        a = None
    else:
        a = abs(Fraction(x))
    codes = finite_codes(name)
    vmax, cmax = max(codes)
    if a is None or a > vmax:
        return sign | cmax
    best = None
    for v, c in codes:
        d = abs(v - a)
        if best is None or d < best[0] or (d == best[0] and c % 2 == 0):
            best = (d, c)
    return sign | best[1]


def value_bits(v):
    if v == "nan":
        return "nan"
    if v == "+inf":
        return "%08x" % f32bits(float("inf"))
    if v == "-inf":
        return "%08x" % f32bits(float("-inf"))
    fv = float(v)
    assert Fraction(f32(fv)) == v, v
    return "%08x" % f32bits(fv)


def encode_inputs(name):
    codes = sorted(finite_codes(name))
    xs = []
    for v, _ in codes:
        xs.append(float(v))
    for (v0, _), (v1, _) in zip(codes, codes[1:]):
        mid = (v0 + v1) / 2
        m = float(mid)
        assert Fraction(m) == mid
        xs += [m, float(torch.nextafter(torch.tensor(m, dtype=torch.float32), torch.tensor(0.0))),
               float(torch.nextafter(torch.tensor(m, dtype=torch.float32), torch.tensor(1e9)))]
    vmax = float(codes[-1][0])
    tiny = float(codes[1][0])  # smallest subnormal
    xs += [vmax * 1.0625, vmax * 1.03125, vmax * 1.5, vmax * 4, 3.0e38, tiny / 2, tiny / 4, tiny * 0.75,
           tiny / 2 * 1.0000001, 1e-30, 1e-45, 0.0, float("inf"), float("nan")]
    rng = random.Random(8)
    for _ in range(400):
        e = rng.uniform(-25, 20)
        xs.append(f32(rng.uniform(1, 2) * 2.0 ** e))
    xs = [f32(x) for x in xs]
    xs += [-x for x in xs]
    return xs


def current_scale(amax, fmax, pow2, eps, value_for_inf):
    amax = torch.tensor(amax, dtype=torch.float32)
    if amax < eps:
        amax = torch.tensor(eps, dtype=torch.float32)
    if torch.isinf(amax) or amax == 0 or torch.isnan(amax):
        return 1.0
    scale = torch.tensor(fmax, dtype=torch.float32) / amax
    if torch.isinf(scale):
        scale = torch.tensor(value_for_inf, dtype=torch.float32)
    if pow2:
        b = f32bits(float(scale)) & 0xFF800000
        return bits_f32(b)
    return float(scale)


def delayed(name, hist_len, algo, margin, steps):
    """steps: list of lists of amaxes observed before each update."""
    fmax = float(decode(name, {"e4m3": 0x7E, "e5m2": 0x7B}[name]))
    hist = torch.zeros(hist_len, dtype=torch.float32)
    scale = torch.ones((), dtype=torch.float32)
    out = []
    for obs in steps:
        for a in obs:
            a = torch.tensor(a, dtype=torch.float32)
            if a > hist[0]:
                hist[0] = a
        if algo == "max":
            amax = torch.max(hist)
        else:
            amax = hist[0].clone()
        hist = torch.roll(hist, -1, 0)
        hist[0] = 0.0
        sf = (torch.tensor(fmax, dtype=torch.float32) / amax) / torch.tensor(2.0 ** margin, dtype=torch.float32)
        sf = torch.where(amax > 0.0, sf, scale)
        sf = torch.where(torch.isfinite(amax), sf, scale)
        if torch.isinf(sf):
            sf = torch.tensor(3.4028234663852886e38, dtype=torch.float32)
        scale = sf
        out.append({"history": ["%08x" % f32bits(float(h)) for h in hist], "scale": "%08x" % f32bits(float(scale))})
    return out


def main():
    g = {"decode": {}, "encode": {}}
    for name in FORMATS:
        # Fraction has no -0: code 0x80 (sign bit alone) is written as -0 directly
        g["decode"][name] = [value_bits(decode(name, c)) if c != 0x80 else "80000000" for c in range(256)]
        xs = encode_inputs(name)
        g["encode"][name] = {"inputs": ["%08x" % f32bits(x) for x in xs], "codes": [encode(name, x) for x in xs]}
    fmaxes = {"e4m3": 448.0, "e5m2": 57344.0}
    cs = []
    for name, fmax in fmaxes.items():
        for amax in [0.0, 1.0, 3.0, 448.0, 1e-3, 7.5e-39, 1e-45, 3.0e38, float("inf"), float("nan"), 12345.678, 0.1]:
            for pow2 in [False, True]:
                for eps in [0.0, 1e-2]:
                    a = f32(amax)
                    s = current_scale(a, fmax, pow2, eps, 3.4028234663852886e38)
                    cs.append({"format": name, "amax": "%08x" % f32bits(a) if a == a else "nan", "pow2": pow2,
                               "epsilon": "%08x" % f32bits(f32(eps)), "scale": "%08x" % f32bits(s)})
    g["current_scale"] = cs
    steps = [[1.5, 0.25], [3.0], [0.0], [1e-3, 2e-3], [200.0], [0.5], [float("inf")], [1e-44], [0.125]]
    ds = []
    for name in FORMATS:
        for hist_len in [1, 3, 1024]:
            for algo in ["most_recent", "max"]:
                for margin in [0, 2]:
                    ds.append({"format": name, "history_len": hist_len, "algo": algo, "margin": margin,
                               "observed": [["%08x" % f32bits(f32(a)) for a in o] for o in steps],
                               "after": [{"history": u["history"][:4] + u["history"][-1:], "scale": u["scale"]}
                                         for u in delayed(name, hist_len, algo, margin, steps)]})
    g["delayed"] = ds
    json.dump(g, __import__("sys").stdout, separators=(",", ":"))


main()
