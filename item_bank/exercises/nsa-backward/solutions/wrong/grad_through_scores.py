# expect: WRONG_ANSWER
# ruff: noqa: F821 (names from the included file)
# Known-wrong: a "straight-through" top-n: the selection branch is multiplied by
# (1 + S) / stopgrad(1 + S), S the summed block scores of the row's selected blocks from an
# undetached p_cmp. The forward value is exactly unchanged, but a gradient flows through the
# selection scores into q and k (the spec's selection is a constant: no such gradient).
# include: ../correct/dense_autograd.py


def _selected_score(q, k, config, block_indices):
    """[B, Hq, T, 1]: Σ over the row's selected blocks j of s[t, g, j] (kernels spec §4.2),
    with p_cmp left in the graph."""
    B, T, Hq, Dk = q.shape
    G = Hq // k.shape[2]
    l, d, lp = config.cmp_block, config.cmp_stride, config.sel_block
    scale = 1.0 / math.sqrt(Dk) if config.scale is None else config.scale
    kc = _pool(k, l, d)
    Tc, Ts = kc.shape[1], (T + lp - 1) // lp
    t = torch.arange(T, device=q.device)
    vis = (torch.arange(Tc, device=q.device) * d + l - 1).view(1, -1) <= t.view(-1, 1)
    s = (q.transpose(1, 2) @ _heads(kc, G).transpose(-1, -2) * scale).masked_fill(~vis, -math.inf)
    p_cmp = torch.softmax(s, -1).nan_to_num(0.0)  # B, Hq, T, Tc
    ci = torch.arange(Tc, device=q.device).view(-1, 1) * d
    sj = torch.arange(Ts, device=q.device).view(1, -1) * lp
    omega = (torch.minimum(ci + l, sj + lp) - torch.maximum(ci, sj)).clamp_min(0) / d
    score = (p_cmp @ omega.to(p_cmp.dtype)).unflatten(1, (-1, G)).sum(2)  # B, Hkv, T, Ts
    bi = block_indices.long().transpose(1, 2)  # B, Hkv, T, n
    picked = torch.gather(score, -1, bi.clamp_min(0)).masked_fill(bi < 0, 0.0).sum(-1)
    return picked.repeat_interleave(G, 1).unsqueeze(-1)


def forward(q, k, v, gates, config, block_indices):
    B, T, Hq, Dk = q.shape
    G = Hq // k.shape[2]
    l, d, lp = config.cmp_block, config.cmp_stride, config.sel_block
    scale = 1.0 / math.sqrt(Dk) if config.scale is None else config.scale
    qh = q.transpose(1, 2)
    t = torch.arange(T, device=q.device)
    kc, vc = _pool(k, l, d), _pool(v, l, d)
    Tc = kc.shape[1]
    vis = (torch.arange(Tc, device=q.device) * d + l - 1).view(1, -1) <= t.view(-1, 1)
    o_cmp = _attend(qh, _heads(kc, G), _heads(vc, G), vis, scale)
    kh, vh = _heads(k, G), _heads(v, G)
    o_slc = _attend(qh, kh, vh, _selection_mask(block_indices, T, lp, G), scale)
    st = 1.0 + _selected_score(q, k, config, block_indices)
    o_slc = o_slc * (st / st.detach())  # the bug: 1 in value, not in gradient
    diff = t.view(-1, 1) - t.view(1, -1)
    o_win = _attend(qh, kh, vh, (diff >= 0) & (diff < config.window), scale)
    g = gates.transpose(1, 2)
    return (g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win).transpose(1, 2)
