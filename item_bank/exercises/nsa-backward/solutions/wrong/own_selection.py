# expect: WRONG_ANSWER
# ruff: noqa: F821 (names from the included file)
# Known-wrong: ignores the given block_indices and differentiates its own top-n selection
# (kernels spec §4.2 scoring, ties to the smaller block). Right whenever the forward's
# indices were the top-n; the backward of a forward given other indices is wrong.
# include: ../correct/dense_autograd.py

_honest = nsa_backward


def _top_n(q, k, config):
    B, T, Hq, Dk = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    l, d, lp, n = config.cmp_block, config.cmp_stride, config.sel_block, config.sel_count
    scale = 1.0 / math.sqrt(Dk) if config.scale is None else config.scale
    qf, kc = q.float(), _pool(k.float(), l, d)
    Tc, Ts = kc.shape[1], (T + lp - 1) // lp
    t = torch.arange(T, device=q.device)
    vis = (torch.arange(Tc, device=q.device) * d + l - 1).view(1, -1) <= t.view(-1, 1)
    s = (qf.transpose(1, 2) @ _heads(kc, G).transpose(-1, -2) * scale).masked_fill(~vis, -math.inf)
    p_cmp = torch.softmax(s, -1).nan_to_num(0.0)
    ci = torch.arange(Tc, device=q.device).view(-1, 1) * d
    sj = torch.arange(Ts, device=q.device).view(1, -1) * lp
    omega = ((torch.minimum(ci + l, sj + lp) - torch.maximum(ci, sj)).clamp_min(0) / d).float()
    score = (p_cmp @ omega).unflatten(1, (-1, G)).sum(2)  # B, Hkv, T, Ts
    cur = (t // lp).view(-1, 1)
    j = torch.arange(Ts, device=q.device).view(1, -1)
    elig = j <= cur
    forced = elig & ((j < config.sel_init) | (j > cur - config.sel_local))
    score = score.masked_fill(~elig, -math.inf).masked_fill(forced, math.inf)
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    bi = torch.full((B, Hkv, T, n), -1, dtype=torch.long, device=q.device)
    for tt in range(T):
        c = min(n, tt // lp + 1)
        bi[:, :, tt, :c] = torch.sort(order[:, :, tt, :c], -1).values
    return bi.transpose(1, 2).to(torch.int32)


def nsa_backward(q, k, v, gates, dout, config, block_indices):
    return _honest(q, k, v, gates, dout, config, _top_n(q, k, config))
