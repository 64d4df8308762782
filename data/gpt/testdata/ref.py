# Reference for data/gpt's held-out tests: Megatron-LM's GPTDataset and
# BlendedDataset index construction (gpt_dataset.py, blended_dataset.py,
# blended_megatron_dataset_builder.py at d98e8a6) with numpy's real
# RandomState, and helpers.cpp transliterated to Python. Writes ref.json.
# Run with /usr/bin/python3 (numpy); CI never runs it.
import json, math, hashlib
from collections import OrderedDict
import numpy

def doc_tokens(case, k, length):
    # Must match docTokens in ref_test.go.
    v, eod = case["vocab"], case["eod"]
    return [(k * 1009 + i * 31) % (v - 1) for i in range(length - 1)] + [eod]

def doc_lengths(n, lo, hi, seed):
    r = numpy.random.RandomState(seed)
    return [int(x) for x in r.randint(lo, hi, size=n)]

# --- gpt_dataset.py ---
def _build_document_index(documents, num_epochs, rng, separate_final_epoch):
    if not separate_final_epoch or num_epochs == 1:
        document_index = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        document_index[:] = documents
        document_index = document_index.reshape(-1)
        document_index = document_index.astype(numpy.int32)
        rng.shuffle(document_index)
        return document_index
    doc_idx_first = _build_document_index(documents, num_epochs - 1, rng, False)
    doc_idx_last = _build_document_index(documents, 1, rng, False)
    return numpy.concatenate((doc_idx_first, doc_idx_last))

def _build_shuffle_index(num_samples, total_size, rng):
    dtype_ = numpy.uint32
    if total_size >= (numpy.iinfo(numpy.uint32).max - 1):
        dtype_ = numpy.int64
    shuffle_idx_first = numpy.arange(start=0, stop=num_samples, step=1, dtype=dtype_)
    rng.shuffle(shuffle_idx_first)
    if num_samples == total_size:
        return shuffle_idx_first
    shuffle_idx_last = numpy.arange(start=num_samples, stop=total_size, step=1, dtype=dtype_)
    rng.shuffle(shuffle_idx_last)
    return numpy.concatenate((shuffle_idx_first, shuffle_idx_last))

# --- helpers.cpp build_sample_idx ---
def build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tpe, drop_last, extra):
    if drop_last:
        num_samples = (num_epochs * tpe - extra) // seq_length
    else:
        num_samples = math.ceil(numpy.float32(num_epochs * tpe - extra) / numpy.float32(seq_length))
    out = [[0, 0]]
    di, off = 0, 0
    while len(out) <= num_samples:
        rem = seq_length + extra
        while rem != 0:
            length = sizes[doc_idx[di]] - off
            rem -= length
            if rem <= 0:
                off += rem + length - extra
                rem = 0
            else:
                if di == len(doc_idx) - 1:
                    off = sizes[doc_idx[di]] - extra
                    break
                di += 1
                off = 0
        out.append([di, off])
    return out

def build_blending_indices(weights, size):
    counts = [0] * len(weights)
    di, dsi = [], []
    for s in range(size):
        x = max(float(s), 1.0)
        best, err = 0, weights[0] * x - counts[0]
        for j in range(1, len(weights)):
            e = weights[j] * x - counts[j]
            if e > err:
                best, err = j, e
        di.append(best); dsi.append(counts[best]); counts[best] += 1
    return di, dsi

def normalize(w):
    a = numpy.array(w, dtype=numpy.float64)
    return (a / numpy.sum(a)).tolist()

def gpt_dataset(case, sizes, path, indices, num_samples, split_name, split_str, split_matrix):
    L, x, seed = case["L"], 1, case["seed"]
    tpe = int(sum(sizes[i] for i in indices))
    E = 1
    if num_samples is not None:
        while E * tpe < num_samples * L + x:
            E += 1
    separate = False
    if E > 1:
        sans = ((E - 1) * tpe - x) // L
        final = num_samples - sans
        per = (tpe - x) // L
        separate = final < int(0.80 * per)
    rng = numpy.random.RandomState(seed)
    doc = _build_document_index(numpy.array(indices, dtype=numpy.int32), E, rng, separate)
    smp = build_sample_idx(sizes, doc.tolist(), L, E, tpe, split_name != "valid" or case.get("drop_last", True), x)
    S = len(smp) - 1
    shf = _build_shuffle_index(sans if separate else S, S, rng)
    u = OrderedDict()
    u["class"] = "GPTDataset"; u["dataset_path"] = path; u["num_samples"] = num_samples
    u["index_split"] = split_name; u["random_seed"] = seed; u["sequence_length"] = L
    u["split"] = split_str; u["split_matrix"] = split_matrix
    u["tokenizer"] = OrderedDict([("class", "RefTok"), ("vocab_size", case["vocab"])])
    return dict(doc=doc.tolist(), smp=smp, shf=shf.tolist(), epochs=E, separate=separate,
                desc=json.dumps(u, indent=4), ids=u)

def ltor(tokens, eod, reset_pos, reset_att, eod_mask):
    L = len(tokens)
    att = numpy.tril(numpy.ones((L, L)))
    loss = numpy.ones(L, dtype=numpy.float32)
    if eod_mask:
        loss[numpy.array(tokens) == eod] = 0.0
    pos = numpy.arange(L)
    if reset_pos or reset_att:
        eod_index = pos[numpy.array(tokens) == eod].copy()
        prev = 0
        for i in eod_index:
            if reset_att:
                att[(i + 1):, :(i + 1)] = 0
            if reset_pos:
                pos[(i + 1):] -= i + 1 - prev
                prev = i + 1
    return att, loss, pos

def get_item(case, sizes, d, i):
    L, x = case["L"], 1
    j = d["shf"][i]
    (d0, o0), (d1, o1) = d["smp"][j], d["smp"][j + 1]
    text = []
    toks = lambda s: doc_tokens(case, s, sizes[s])
    if d0 == d1:
        text = toks(d["doc"][d0])[o0:o1 + x]
    else:
        for k in range(d0, d1 + 1):
            t = toks(d["doc"][k])
            off = 0 if k > d0 else o0
            text += t[off:] if k < d1 else t[:o1 + x]
    text += [-1] * (L + x - len(text))
    tokens, labels = text[:-1], text[1:]
    att, loss, pos = ltor(tokens, case["eod"], case["reset_pos"], case["reset_att"], case["eod_mask"])
    for t in range(L):
        if labels[t] == -1:
            loss[t] = 0
    tokens = [0 if v == -1 else v for v in tokens]
    labels = [0 if v == -1 else v for v in labels]
    mask = ["".join("1" if att[q, k] > 0.5 else "0" for k in range(L)) for q in range(L)]
    return dict(tokens=tokens, labels=labels, loss_mask=[float(v) for v in loss], position_ids=pos.tolist(), mask=mask)

def expansion(v):
    out = [0]
    for f in v:
        out.append(out[-1] + f)
    return out

def split_matrix(split):
    import re
    v = normalize(list(map(float, re.findall(r"[.0-9]+", split))) + [0.0] * 0)
    v = v + [0.0] * (3 - len(v))
    e = expansion(v)
    return [None if e[i + 1] <= e[i] else (e[i], e[i + 1]) for i in range(3)]

def run_single(case):
    sizes = doc_lengths(case["docs"], case["lo"], case["hi"], case["len_seed"])
    m = split_matrix(case["split"])
    out = dict(case=case, sizes=sizes, splits={})
    for si, name in enumerate(["train", "valid", "test"]):
        if m[si] is None:
            continue
        beg, end = int(round(m[si][0] * float(len(sizes)))), int(round(m[si][1] * float(len(sizes))))
        d = gpt_dataset(case, sizes, "@PATH@", list(range(beg, end)), case["num_samples"][si], name, case["split"], m)
        items = [get_item(case, sizes, d, i) for i in case["items"] if i < len(d["shf"])]
        out["splits"][name] = dict(doc=d["doc"], smp=d["smp"], shf=d["shf"], epochs=d["epochs"], separate=d["separate"], desc=d["desc"], items=items)
    return out

def run_blend(case):
    # _build_blended_dataset_splits with --data-path w1 p1 w2 p2 w3 p3.
    all_sizes = [doc_lengths(n, lo, hi, s) for (n, lo, hi, s) in case["members"]]
    weights = normalize(case["weights"])
    m = split_matrix(case["split"])
    N = case["num_samples"]
    surplus = 0.005
    out = dict(case=case, sizes=all_sizes, splits={})
    for si, name in enumerate(["train", "valid", "test"]):
        if m[si] is None:
            continue
        targets = [int(math.ceil(N[si] * w)) for w in weights]
        buffers = [int(math.ceil(math.ceil(N[si] * w) * (1 + surplus))) for w in weights]
        mids, ids = [], []
        for j, sizes in enumerate(all_sizes):
            beg, end = int(round(m[si][0] * float(len(sizes)))), int(round(m[si][1] * float(len(sizes))))
            c = dict(case, vocab=case["vocab"])
            d = gpt_dataset(c, sizes, "@PATH%d@" % j, list(range(beg, end)), buffers[j], name, case["split"], m)
            mids.append(len(d["shf"])); ids.append(d["ids"])
        size = sum(targets)
        di, dsi = build_blending_indices(weights, size)
        u = OrderedDict()
        u["class"] = "BlendedDataset"; u["datasets"] = ids; u["split"] = name; u["weights"] = weights; u["size"] = size
        out["splits"][name] = dict(mid_lengths=mids, dataset_index=di, dataset_sample_index=dsi, desc=json.dumps(u, indent=4))
    return out

cases = {
    # multi-epoch train (not separate), separate final epoch in valid, int32 tokens, all masks on
    "multi_epoch_int32_masks": run_single(dict(docs=120, lo=1, hi=40, len_seed=3, split="90,8,2", L=16, seed=77,
        num_samples=[400, 40, 3], vocab=100000, eod=99999, reset_pos=True, reset_att=True, eod_mask=True, items=[0, 1, 2, 17])),
    # separate final epoch in train, only eod mask loss
    "separate_final_epoch": run_single(dict(docs=50, lo=3, hi=30, len_seed=5, split="90,10", L=8, seed=1234,
        num_samples=[110, None, None], vocab=1000, eod=999, reset_pos=False, reset_att=False, eod_mask=True, items=[0, 5])),
    "blend3": run_blend(dict(members=[(40, 1, 30, 11), (25, 5, 60, 12), (60, 1, 9, 13)], weights=[5, 3, 2], split="98,2,0",
        L=8, seed=4321, num_samples=[200, 20, 0], vocab=1000, eod=999)),
}
def run_unweighted(case):
    # --data-path p0 p1 p2 (no weights): mid-level datasets of one epoch;
    # weights = their lengths; size min(N, sum) (normalized weights) or, for
    # N None, the exhaustive blend over the lengths.
    all_sizes = [doc_lengths(n, lo, hi, s) for (n, lo, hi, s) in case["members"]]
    m = split_matrix(case["split"])
    out = dict(case=case, sizes=all_sizes, splits={})
    for si, name in enumerate(["train", "valid", "test"]):
        if m[si] is None:
            continue
        lens, ids = [], []
        for j, sizes in enumerate(all_sizes):
            beg, end = int(round(m[si][0] * float(len(sizes)))), int(round(m[si][1] * float(len(sizes))))
            d = gpt_dataset(case, sizes, "@PATH%d@" % j, list(range(beg, end)), None, name, case["split"], m)
            lens.append(len(d["shf"])); ids.append(d["ids"])
        N = case["num_samples"][si]
        if N is not None:
            size = min(N, sum(lens)); weights = normalize(lens)
            di, dsi = build_blending_indices(weights, size)
        else:
            size = None; weights = lens
            di, dsi = build_exhaustive(lens)
        u = OrderedDict()
        u["class"] = "BlendedDataset"; u["datasets"] = ids; u["split"] = name; u["weights"] = weights; u["size"] = size
        out["splits"][name] = dict(mid_lengths=lens, dataset_index=di, dataset_sample_index=dsi, desc=json.dumps(u, indent=4))
    return out

def build_exhaustive(sizes):
    total = sum(sizes)
    weights = [s / float(total) for s in sizes]
    counts = [0] * len(sizes)
    unspent = set(range(len(sizes)))
    di, dsi = [], []
    s = 0
    while unspent:
        x = max(float(s), 1.0)
        best, err = -1, -1.7976931348623157e308
        for j in sorted(unspent):
            e = weights[j] * x - counts[j]
            if e > err:
                best, err = j, e
        di.append(best); dsi.append(counts[best]); counts[best] += 1
        if sizes[best] - counts[best] == 0:
            unspent.discard(best)
        s += 1
    return di, dsi

def run_per_split(case):
    # --train-data-path p0 --valid-data-path p1: whole datasets, split and
    # split_matrix None in the description.
    out = dict(case=case, sizes=[], splits={})
    for si, (name, member) in enumerate(zip(["train", "valid"], case["members"])):
        sizes = doc_lengths(*member)
        out["sizes"].append(sizes)
        d = gpt_dataset(case, sizes, "@PATH%d@" % si, list(range(len(sizes))), case["num_samples"][si], name, None, None)
        out["splits"][name] = dict(doc=d["doc"], smp=d["smp"], shf=d["shf"], epochs=d["epochs"], separate=d["separate"], desc=d["desc"], items=[])
    return out

cases["unweighted"] = run_unweighted(dict(members=[(30, 5, 20, 21), (20, 5, 40, 22), (15, 4, 9, 23)], split="80,20,0",
    L=8, seed=99, num_samples=[50, None, None], vocab=1000, eod=999))
cases["per_split"] = run_per_split(dict(members=[(30, 1, 20, 31), (12, 3, 9, 32)], L=8, seed=5, num_samples=[70, 9, None],
    vocab=1000, eod=999))
# Python json.dumps corner cases for describe.go.
cases["describe"] = [json.dumps(OrderedDict([("class", "X"), ("path", "/tmp/é\u2028\U0001F600\"\\\t\x01\x7f"), ("f", [1e-05, 1e16, 123456789.0, 0.1 + 0.2, 2.5, -0.0, 1.0]),
    ("empty", []), ("obj", OrderedDict()), ("none", None), ("t", True), ("n", -7)]), indent=4)]
with open("ref.json", "w") as f:
    json.dump(cases, f, separators=(",", ":"))
