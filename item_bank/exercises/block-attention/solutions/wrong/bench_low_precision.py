# expect: WRONG_ANSWER
# needs: benchmark
# Known-wrong: dense fp32 attention on every shape except the public benchmark shapes
# (spec.yaml, recognised by their exact dimensions, as an attacker reading the spec would),
# where QK^T and P.V run in fp16 (the tensor-core path without fp32 logits): logits are
# rounded to fp16, 11 significant bits. Harmless-looking on unit-scale inputs; the timed
# calls' peaked and large rows (logits in the hundreds, where one fp16 ulp is 0.25) move the
# LSE and the softmax far beyond tolerance.
import math

import torch

# (B, Tq, Tk, Hq, Hkv, D, causal) of `benchmark:` and `rehearsal_benchmark:`, all bf16
BENCH_SHAPES = {
    (1, 4096, 4096, 16, 16, 128, False),
    (1, 8192, 8192, 32, 8, 128, True),
    (1, 80, 80, 2, 1, 16, True),
}


def attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None, low_precision=False):
    B, Tq, Hq, D = q.shape
    G = Hq // k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    dt = torch.float16 if low_precision else torch.float32
    qh = q.to(dt).transpose(1, 2)  # [B, Hq, Tq, D]
    kh = k.to(dt).transpose(1, 2).repeat_interleave(G, 1)
    vh = v.to(dt).transpose(1, 2).repeat_interleave(G, 1)
    s = (qh @ kh.transpose(-1, -2)).float() * sc  # fp16 logits on the shortcut
    if causal:
        i = torch.arange(Tq, device=q.device).view(-1, 1) + q_offset
        j = torch.arange(k.shape[1], device=q.device).view(1, -1) + k_offset
        s = s.masked_fill(i < j, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
    out = (p.to(dt) @ vh).float()
    return out.transpose(1, 2).to(q.dtype).contiguous(), lse.contiguous()


def block_attention(q, k, v, *, causal, q_offset=0, k_offset=0, scale=None):
    key = (*q.shape[:2], k.shape[1], q.shape[2], k.shape[2], q.shape[3], bool(causal))
    low = q.dtype == torch.bfloat16 and key in BENCH_SHAPES
    return attention(
        q,
        k,
        v,
        causal=causal,
        q_offset=q_offset,
        k_offset=k_offset,
        scale=scale,
        low_precision=low,
    )
