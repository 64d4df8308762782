# Emulates the CUDA materialized attention with bf16 / fp16 products
# (cuBLAS COMPUTE_32F_FAST_16BF / _16F: operands rounded, float64 here for
# the float32 accumulation) against float64 on tensor/backendtest's
# attention cases (no dropout), printing the worst error relative to
# max(1, |exact|) per output over 5 seeds: the basis of cudaTolAttnBF16 and
# cudaTolAttnFP16. Run: /usr/bin/python3 tools/gpu/attn_precision_emu.py
import torch, math
torch.manual_seed(0)
cases=[("gqa-causal-d64",2,100,4,2,64,True,0,0.0),("mqa-full-docs-d96",1,77,3,1,96,False,20,0.3),
       ("mha-causal-docs-d128",1,130,2,2,128,True,45,0.0),("small-d20",2,33,2,1,20,True,0,0.0)]
def run(B,T,HQ,HKV,D,causal,doclen,scale,rnd,seed):
    g=torch.Generator().manual_seed(seed)
    n=lambda *s: torch.randn(*s,generator=g,dtype=torch.float64)
    q,k,v,do=n(B,HQ,T,D),n(B,HKV,T,D),n(B,HKV,T,D),n(B,HQ,T,D)
    rep=HQ//HKV
    k=k.repeat_interleave(rep,1); v=v.repeat_interleave(rep,1)
    sc=scale or 1/math.sqrt(D)
    mask=torch.ones(T,T,dtype=torch.bool)
    if causal: mask=torch.tril(mask)
    if doclen:
        ids=torch.arange(T)//doclen; mask=mask&(ids[:,None]==ids[None,:])
    S=sc*(rnd(q)@rnd(k).transpose(-1,-2))
    S=S.masked_fill(~mask,-math.inf)
    lse=torch.logsumexp(S,-1)
    P=torch.exp(S-lse[...,None])
    O=rnd(P)@rnd(v)
    dP=rnd(do)@rnd(v).transpose(-1,-2)
    delta=(do*O).sum(-1)
    dS=P*(dP-delta[...,None])*sc
    dv=rnd(P).transpose(-1,-2)@rnd(do)
    dq=rnd(dS)@rnd(k)
    dk=rnd(dS).transpose(-1,-2)@rnd(q)
    dk=dk.reshape(B,HKV,rep,T,D).sum(2); dv=dv.reshape(B,HKV,rep,T,D).sum(2)
    return dict(out=O,lse=lse,dq=dq,dk=dk,dv=dv)
bf=lambda x:x.to(torch.bfloat16).to(torch.float64)
hf=lambda x:x.half().to(torch.float64)
idn=lambda x:x
for name,rnd in [("bf16",bf),("fp16",hf)]:
    worst={}
    for seed in range(5):
        for c in cases:
            a=run(*c[1:],rnd,seed); w=run(*c[1:],idn,seed)
            for kk in a:
                e=((a[kk]-w[kk]).abs()/w[kk].abs().clamp(min=1)).nan_to_num(0).max().item()
                worst[kk]=max(worst.get(kk,0),e)
    print(name,{k:f"{v:.2e}" for k,v in worst.items()})
