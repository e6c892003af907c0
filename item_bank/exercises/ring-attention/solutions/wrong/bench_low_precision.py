# expect: WRONG_ANSWER
# needs: benchmark
# Known-wrong: the exact P2P ring on every shape except the public benchmark shapes
# (spec.yaml, recognised by each rank's shard dimensions, as an attacker reading the spec
# would), where every ring step's QK^T and P.V run in fp16 (logits rounded to 11 significant
# bits; the merge stays fp32). The ring contract holds (P-1 transfers, no collectives): only
# the values of the timed calls are wrong, by far on their peaked and large rows.
import math

import torch
import torch.distributed as dist


def _pos(T, P, r, layout, device):
    if layout == "contiguous":
        return torch.arange(r * T // P, (r + 1) * T // P, device=device)
    if layout == "zigzag":
        c = T // (2 * P)
        return torch.cat(
            [
                torch.arange(r * c, (r + 1) * c, device=device),
                torch.arange((2 * P - 1 - r) * c, (2 * P - r) * c, device=device),
            ]
        )
    return torch.arange(r, T, P, device=device)


def _attend(q, k, v, qpos, kpos, causal, sc, low_precision):
    G = q.shape[2] // k.shape[2]
    dt = torch.float16 if low_precision else torch.float32  # the shortcut: fp16 QK^T and P.V
    qf = q.to(dt).transpose(1, 2)
    kf = k.to(dt).transpose(1, 2).repeat_interleave(G, 1)
    vf = v.to(dt).transpose(1, 2).repeat_interleave(G, 1)
    B, H, n = qf.shape[:3]
    # Query chunks keep the fp32 score tile near 1 GiB: at 32k tokens per rank the whole
    # [B, H, n, n] tile would be 128 GiB.
    step = max(1, (1 << 28) // max(1, B * H * kf.shape[2]))
    outs, lses = [], []
    for i in range(0, n, step):
        s = (qf[:, :, i : i + step] @ kf.transpose(-1, -2)).float() * sc
        if causal:
            s = s.masked_fill(qpos[i : i + step].view(-1, 1) < kpos.view(1, -1), float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
        outs.append((p.to(dt) @ vf).float())
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)  # B,H,Tq,D fp32 ; B,H,Tq


def _merge(o, l, o2, l2):
    lse = torch.logaddexp(l, l2)
    safe = torch.where(torch.isneginf(lse), 0.0, lse)
    return o * torch.exp(l - safe).unsqueeze(-1) + o2 * torch.exp(l2 - safe).unsqueeze(-1), lse


def ring(q, k, v, *, causal, group, layout="zigzag", scale=None, low_precision=False):
    P = dist.get_world_size(group)
    r = dist.get_rank(group)
    B, n, Hq, D = q.shape
    T = n * P
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    nxt = dist.get_global_rank(group, (r + 1) % P)
    prv = dist.get_global_rank(group, (r - 1) % P)
    qpos = _pos(T, P, r, layout, q.device)
    o = torch.zeros(B, Hq, n, D, device=q.device)
    l = torch.full((B, Hq, n), float("-inf"), device=q.device)
    kv = torch.stack([k, v]).contiguous()
    for step in range(P):
        src = (r - step) % P
        reqs = []
        if step < P - 1:  # post the next transfer before computing on the current block
            buf = torch.empty_like(kv)
            reqs = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, kv, nxt, group), dist.P2POp(dist.irecv, buf, prv, group)]
            )
        kpos = _pos(T, P, src, layout, q.device)
        o2, l2 = _attend(q, kv[0], kv[1], qpos, kpos, causal, sc, low_precision)
        o, l = _merge(o, l, o2, l2)
        for req in reqs:
            req.wait()
        if step < P - 1:
            kv = buf
    return o.transpose(1, 2).to(q.dtype).contiguous(), l.contiguous()


# each rank's (B, T/P, Hq, Hkv, D, causal, layout) of `benchmark:` and `rehearsal_benchmark:`
# at world_size 2, all bf16
BENCH_SHAPES = {(1, 32768, 32, 8, 128, True, "zigzag"), (1, 64, 2, 1, 16, True, "zigzag")}


def ring_attention_local(q, k, v, *, causal, group, layout="zigzag", scale=None):
    key = (*q.shape[:3], k.shape[2], q.shape[3], bool(causal), layout)
    low = q.dtype == torch.bfloat16 and key in BENCH_SHAPES
    return ring(q, k, v, causal=causal, group=group, layout=layout, scale=scale, low_precision=low)
