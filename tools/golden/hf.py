#!/usr/bin/python3
"""Hugging Face-layout goldens for gotron's HF conversion (ckpt/hf, gotron score).

Usage (repository root, Debian's python3-torch 1.13, CPU; no `transformers`):

    /usr/bin/python3 tools/golden/hf.py [outdir]     # default ckpt/hf/testdata

For each case below it builds a tiny model as plain PyTorch modules that carry
Hugging Face's parameter names and reproduce Hugging Face's math exactly:

  * GPT2LMHeadModel: transformer.wte/wpe, h.N.ln_1, attn.c_attn and attn.c_proj
    as Conv1D (weight stored (in, out): y = x @ W + b), ln_2, mlp.c_fc/c_proj,
    gelu_new (tanh GELU), ln_f, lm_head tied to wte (or untied).
  * LlamaForCausalLM: model.embed_tokens, layers.N.self_attn.{q,k,v,o}_proj,
    HF's rotate_half RoPE (cos/sin of cat(freqs, freqs)), repeat_kv GQA,
    mlp.{gate,up,down}_proj with SiLU, RMSNorm in float32-style
    (x * rsqrt(mean(x^2) + eps)) * w, model.norm, lm_head (tied or untied).

Weights are seeded random values rounded to the case's dtype (F32, BF16 or
F16), saved as safetensors written by hand (struct + json; one file or two
shards with model.safetensors.index.json) next to config.json. The forward
pass runs in float64 on those rounded weights and the logits of TOKENS are
stored in golden.safetensors ("logits", F32 [T, vocab]; "tokens", I32 [T]).
The GPT-2 cases also get a tiny byte-level BPE tokenizer (vocab.json,
merges.txt: 256 byte symbols, 3 merges, <|endoftext|>) so `gotron score
--text` and tokenizer carrying can be tested. CI never runs Python.
"""
import json
import math
import os
import struct
import sys

import torch

torch.set_default_dtype(torch.float64)

TOKENS = [3, 17, 42, 99, 5, 5, 64, 1, 77, 23]

CASES = {
    # name: architecture, dtype, config
    "gpt2_tied_f32": dict(arch="gpt2", dtype="F32", tied=True, vocab=260, hidden=32, layers=2, heads=4,
                          inner=None, positions=16, eps=1e-5, tokenizer=True),
    "gpt2_untied_bf16": dict(arch="gpt2", dtype="BF16", tied=False, vocab=260, hidden=32, layers=2, heads=4,
                             inner=48, positions=16, eps=1e-5, tokenizer=True),
    "llama_gqa_untied_f32": dict(arch="llama", dtype="F32", tied=False, vocab=100, hidden=32, layers=2, heads=4,
                                 kv_heads=2, inner=48, positions=32, eps=1e-6, theta=10000.0),
    "llama_gqa_tied_bf16": dict(arch="llama", dtype="BF16", tied=True, vocab=100, hidden=32, layers=2, heads=4,
                                kv_heads=1, inner=40, positions=32, eps=1e-5, theta=500000.0),
    "llama_mha_untied_f16_sharded": dict(arch="llama", dtype="F16", tied=False, vocab=100, hidden=32, layers=2,
                                         heads=4, kv_heads=4, inner=48, positions=32, eps=1e-5, theta=10000.0,
                                         shards=2),
}

TORCH_DTYPE = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
TORCH_DTYPE_NAME = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


# ---------------------------------------------------------------- GPT-2 (HF modeling_gpt2.py)

class Conv1D(torch.nn.Module):
    """HF's Conv1D: weight (nx, nf), y = x @ weight + bias."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(nx, nf))
        self.bias = torch.nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(x.size()[:-1] + (self.weight.size(1),))


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.nh = c["hidden"], c["heads"]
        self.c_attn = Conv1D(3 * self.h, self.h)
        self.c_proj = Conv1D(self.h, self.h)

    def forward(self, x):  # x (B, T, h)
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(self.h, dim=2)
        split = lambda t: t.view(B, T, self.nh, self.h // self.nh).permute(0, 2, 1, 3)  # (B, nh, T, d)
        q, k, v = split(q), split(k), split(v)
        w = q @ k.transpose(-1, -2) / math.sqrt(v.size(-1))  # scale_attn_weights
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        o = torch.softmax(w, dim=-1) @ v  # (B, nh, T, d)
        return self.c_proj(o.permute(0, 2, 1, 3).reshape(B, T, self.h))


class GPT2MLP(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        inner = c["inner"] or 4 * c["hidden"]
        self.c_fc = Conv1D(inner, c["hidden"])
        self.c_proj = Conv1D(c["hidden"], inner)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class GPT2Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(c["hidden"], eps=c["eps"])
        self.attn = GPT2Attention(c)
        self.ln_2 = torch.nn.LayerNorm(c["hidden"], eps=c["eps"])
        self.mlp = GPT2MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = torch.nn.Embedding(c["vocab"], c["hidden"])
        self.wpe = torch.nn.Embedding(c["positions"], c["hidden"])
        self.h = torch.nn.ModuleList([GPT2Block(c) for _ in range(c["layers"])])
        self.ln_f = torch.nn.LayerNorm(c["hidden"], eps=c["eps"])

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))[None]
        for b in self.h:
            x = b(x)
        return self.ln_f(x)


class GPT2LMHeadModel(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tied = c["tied"]
        self.transformer = GPT2Model(c)
        self.lm_head = torch.nn.Linear(c["hidden"], c["vocab"], bias=False)

    def forward(self, ids):
        w = self.transformer.wte.weight if self.tied else self.lm_head.weight
        return self.transformer(ids) @ w.T


def gpt2_config(c):
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "bos_token_id": c["vocab"] - 1,
        "eos_token_id": c["vocab"] - 1, "initializer_range": 0.02, "layer_norm_epsilon": c["eps"],
        "n_ctx": c["positions"], "n_embd": c["hidden"], "n_head": c["heads"], "n_inner": c["inner"],
        "n_layer": c["layers"], "n_positions": c["positions"], "reorder_and_upcast_attn": False,
        "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True, "summary_activation": None,
        "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True, "tie_word_embeddings": c["tied"], "torch_dtype": TORCH_DTYPE_NAME[c["dtype"]],
        "transformers_version": "4.44.0", "use_cache": True, "vocab_size": c["vocab"],
    }


# ---------------------------------------------------------------- Llama (HF modeling_llama.py)

class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(d, T, theta):
    # HF: inv_freq in float32 from int64 arange; freqs = positions (float32) x inv_freq, in float32.
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().double(), emb.sin().double()  # (T, d)


def repeat_kv(x, n_rep):  # (B, kv, T, d) -> (B, kv*n_rep, T, d)
    B, kv, T, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, kv, n_rep, T, d).reshape(B, kv * n_rep, T, d)


class LlamaAttention(torch.nn.Module):
    """Llama's attention. c["head_dim"] (default hidden/heads) may differ from hidden/heads; bias gives q/k/v_proj
    biases (Qwen2's); qk_norm an RMSNorm over each query and key head before RoPE (Qwen3's q_norm, k_norm)."""

    def __init__(self, c, bias=False, qk_norm=False):
        super().__init__()
        h, self.nh, self.nkv = c["hidden"], c["heads"], c["kv_heads"]
        self.d, self.theta = c.get("head_dim") or h // self.nh, c["theta"]
        self.q_proj = torch.nn.Linear(h, self.nh * self.d, bias=bias)
        self.k_proj = torch.nn.Linear(h, self.nkv * self.d, bias=bias)
        self.v_proj = torch.nn.Linear(h, self.nkv * self.d, bias=bias)
        self.o_proj = torch.nn.Linear(self.nh * self.d, h, bias=False)
        if qk_norm:
            self.q_norm = LlamaRMSNorm(self.d, c["eps"])
            self.k_norm = LlamaRMSNorm(self.d, c["eps"])
        self.qk_norm = qk_norm

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.d)
        k = self.k_proj(x).view(B, T, self.nkv, self.d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, nh, T, d)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        cos, sin = rope_cos_sin(self.d, T, self.theta)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.nh // self.nkv), repeat_kv(v, self.nh // self.nkv)
        w = q @ k.transpose(2, 3) / math.sqrt(self.d)
        w = w + torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        o = torch.softmax(w, dim=-1) @ v  # (B, nh, T, d)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.d))


class LlamaMLP(torch.nn.Module):
    """The SwiGLU MLP; Qwen2-MoE's and Qwen3-MoE's experts and dense MLPs are the same (Qwen2MoeMLP, Qwen3MoeMLP)."""

    def __init__(self, h, f):
        super().__init__()
        self.gate_proj = torch.nn.Linear(h, f, bias=False)
        self.up_proj = torch.nn.Linear(h, f, bias=False)
        self.down_proj = torch.nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(torch.nn.Module):
    """A pre-norm layer: attention, then mlp (an MLP or an MoE block, built by the subclass's make_mlp)."""

    def __init__(self, c, i=0, attention=None):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(c["hidden"], c["eps"])
        self.self_attn = attention or LlamaAttention(c)
        self.post_attention_layernorm = LlamaRMSNorm(c["hidden"], c["eps"])
        self.make_mlp(c, i)

    def make_mlp(self, c, i):
        self.mlp = LlamaMLP(c["hidden"], c["inner"])

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(torch.nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c["vocab"], c["hidden"])
        self.layers = torch.nn.ModuleList([layer(c, i) for i in range(c["layers"])])
        self.norm = LlamaRMSNorm(c["hidden"], c["eps"])

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(torch.nn.Module):
    """LlamaForCausalLM's layout; layer (default LlamaDecoderLayer) builds layer i of the MoE variants."""

    def __init__(self, c, layer=LlamaDecoderLayer):
        super().__init__()
        self.tied = c["tied"]
        self.model = LlamaModel(c, layer)
        self.lm_head = torch.nn.Linear(c["hidden"], c["vocab"], bias=False)

    def forward(self, ids):
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return self.model(ids) @ w.T


def llama_config(c):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": c["hidden"], "initializer_range": 0.02, "intermediate_size": c["inner"],
        "max_position_embeddings": c["positions"], "mlp_bias": False, "num_attention_heads": c["heads"],
        "num_hidden_layers": c["layers"], "num_key_value_heads": c["kv_heads"], "pretraining_tp": 1,
        "rms_norm_eps": c["eps"], "rope_scaling": None, "rope_theta": c["theta"],
        "tie_word_embeddings": c["tied"], "torch_dtype": TORCH_DTYPE_NAME[c["dtype"]],
        "transformers_version": "4.44.0", "use_cache": True, "vocab_size": c["vocab"],
    }


# ---------------------------------------------------------------- files

def tensor_bytes(t, dt):
    t = t.detach().contiguous().to(TORCH_DTYPE[dt] if dt in TORCH_DTYPE else torch.int32)
    if dt == "BF16":
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    if dt == "F16":
        return t.numpy().astype("<f2").tobytes()
    if dt == "F32":
        return t.numpy().astype("<f4").tobytes()
    return t.numpy().astype("<i4").tobytes()


def write_safetensors(path, tensors, dtypes, metadata=None):
    """Upstream's layout: tensors sorted by descending dtype alignment, then name."""
    order = {"F32": 0, "I32": 0, "BF16": 1, "F16": 1}
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in sorted(tensors, key=lambda n: (order[dtypes[n]], n)):
        data = tensor_bytes(tensors[name], dtypes[name])
        header[name] = {"dtype": dtypes[name], "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return off


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


def write_tokenizer(out):
    """A 260-token byte-level BPE: ids 0..255 are the byte symbols in byte order."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for i, (a, b) in enumerate(merges):
        vocab[a + b] = 256 + i
    vocab["<|endoftext|>"] = 259
    with open(os.path.join(out, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 16, "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
                   "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 259, "eos_token_id": 259, "transformers_version": "4.44.0"}, f, indent=2)


def init_weights(name, model, c, special=lambda pname, gen: None):
    """Seeded random weights rounded to c["dtype"] (default F32), copied into model; returns the stored tensors.
    special(pname, gen) may return a parameter's float32 values instead of the default draw."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    dtype = TORCH_DTYPE[c.get("dtype", "F32")]
    state = {}
    for pname, p in model.named_parameters():
        if c["tied"] and pname == "lm_head.weight":
            continue
        v = special(pname, gen)
        if v is not None:
            pass
        elif pname.endswith("layernorm.weight") or pname.endswith("norm.weight") or ".ln_" in pname:
            v = (1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)) if pname.endswith("weight") \
                else 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        else:
            v = 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        v = v.to(dtype)  # the stored values
        with torch.no_grad():
            p.copy_(v.double())
        state[pname] = v
    if c["tied"]:
        with torch.no_grad():
            model.lm_head.weight.copy_(model.transformer.wte.weight if c["arch"] == "gpt2" else model.model.embed_tokens.weight)
    return state


def write_case(name, c, out, model, state, cfg):
    """config.json, the weights (one file or c["shards"] shards with an index), the tokenizer if asked and
    golden.safetensors (the float64 logits of TOKENS) in out/name."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    dtypes = {n: c.get("dtype", "F32") for n in state}
    if c.get("shards", 1) == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), state, dtypes, {"format": "pt"})
    else:
        names = list(state)
        n = c["shards"]
        per = (len(names) + n - 1) // n
        weight_map, total = {}, 0
        for i in range(n):
            part = names[i * per:(i + 1) * per]
            fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            total += write_safetensors(os.path.join(d, fname), {k: state[k] for k in part},
                                       {k: dtypes[k] for k in part}, {"format": "pt"})
            weight_map.update({k: fname for k in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    if c.get("tokenizer"):
        write_tokenizer(d)

    with torch.no_grad():
        ids = torch.tensor([TOKENS])
        logits = model(ids)[0]
    write_safetensors(os.path.join(d, "golden.safetensors"),
                      {"logits": logits.float(), "tokens": torch.tensor(TOKENS, dtype=torch.int32)},
                      {"logits": "F32", "tokens": "I32"})
    print(f"{name}: {sum(v.numel() for v in state.values())} params, logits {tuple(logits.shape)}")


def build(name, c, out):
    model = GPT2LMHeadModel(c) if c["arch"] == "gpt2" else LlamaForCausalLM(c)
    state = init_weights(name, model, c)
    write_case(name, c, out, model, state, gpt2_config(c) if c["arch"] == "gpt2" else llama_config(c))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "ckpt/hf/testdata"
    for name, c in CASES.items():
        build(name, c, out)


if __name__ == "__main__":
    main()
