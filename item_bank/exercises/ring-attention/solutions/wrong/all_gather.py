# expect: POLICY_VIOLATION
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


def ring_attention_local(q, k, v, *, causal, group, layout="zigzag", scale=None):
    # correct values, but gathers all K/V on every rank instead of passing it around the ring
    P = dist.get_world_size(group)
    r = dist.get_rank(group)
    B, n, Hq, D = q.shape
    T = n * P
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    ks = [torch.empty_like(k) for _ in range(P)]
    vs = [torch.empty_like(v) for _ in range(P)]
    dist.all_gather(ks, k.contiguous(), group=group)
    dist.all_gather(vs, v.contiguous(), group=group)
    kall, vall = torch.cat(ks, 1), torch.cat(vs, 1)
    kpos = torch.cat([_pos(T, P, s, layout, q.device) for s in range(P)])
    qpos = _pos(T, P, r, layout, q.device)
    G = Hq // k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = kall.float().transpose(1, 2).repeat_interleave(G, 1)
    vf = vall.float().transpose(1, 2).repeat_interleave(G, 1)
    s = qf @ kf.transpose(-1, -2) * sc
    if causal:
        s = s.masked_fill(qpos.view(-1, 1) < kpos.view(1, -1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return (p @ vf).transpose(1, 2).to(q.dtype).contiguous(), lse.contiguous()
