"""Ground-truth NSA forward: dense fp32 PyTorch, three explicit masks, three softmaxes.

Written for clarity, not speed: O(T²) memory (T ≤ 4k on CPU, ≤ 32k on GPU). Every fast
path is tested against this function, so each step follows spec §4.2 line by line.
"""

from __future__ import annotations

import torch

from kernels.nsa.config import NSAAux, NSAConfig, omega_matrix
from kernels.nsa.validate import check_nsa_args


def _masked_softmax(logits: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last dim with a bool mask; rows with nothing visible → (p=0, lse=−inf)."""
    logits = logits.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # −inf for empty rows
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(logits - safe.unsqueeze(-1)) * mask  # exp(−inf) = 0, never NaN
    return p, lse


def compress_mean(x: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """k̃_i = mean(x[:, i·d : i·d+l]) in fp32; x [B, T, H, D] → [B, Tc, H, D]."""
    t = x.shape[1]
    if t < cfg.cmp_block:
        return x.new_zeros((x.shape[0], 0, x.shape[2], x.shape[3]), dtype=torch.float32)
    # unfold: [B, Tc, H, D, l] windows of length l with step d along T
    return x.float().unfold(1, cfg.cmp_block, cfg.cmp_stride).mean(dim=-1)


def select_blocks(scores: torch.Tensor, pos: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """Top-n over s [B, C, Hkv, Ts] (−inf = ineligible, +inf = forced) → [B, C, Hkv, n] int32.

    pos [C] holds the absolute query positions of the C rows (a chunk or the whole sequence).

    Ties go to the smaller block index: a stable descending sort keeps index order among
    equal scores. The kept count per row is min(n, ⌊t/l′⌋ + 1); result ascending, −1 padded.
    """
    b, t, hkv, ts = scores.shape
    n = cfg.sel_count
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # [B,T,Hkv,Ts]
    count = torch.clamp(pos // cfg.sel_block + 1, max=n).view(1, t, 1, 1)
    slot = torch.arange(n, device=scores.device).view(1, 1, 1, n)
    if ts < n:  # fewer blocks than slots: pad the order so slots beyond Ts exist
        pad = order.new_zeros((b, t, hkv, n - ts))
        order = torch.cat([order, pad], dim=-1)
    top = torch.where(slot < count, order[..., :n], torch.full_like(order[..., :n], -1))
    big = torch.iinfo(torch.int64).max
    top = torch.where(top < 0, torch.full_like(top, big), top).sort(dim=-1).values
    top = torch.where(top == big, torch.full_like(top, -1), top)
    return top.to(torch.int32)


def block_scores(
    p_cmp: torch.Tensor,
    seq_len: int,
    hkv: int,
    cfg: NSAConfig,
    pos: torch.Tensor | None = None,
) -> torch.Tensor:
    """s [B, T, Hkv, Ts] from p_cmp [B, Hq, T, Tc]: ω transform, sum over the group, forcing.

    ``pos`` [T]: the rows' query positions when they are not 0..T-1 (a chunk of a sequence)."""
    b, hq, t, tc = p_cmp.shape
    ts = -(-seq_len // cfg.sel_block)
    omega = omega_matrix(tc, ts, cfg).to(p_cmp.device, p_cmp.dtype)  # [Tc, Ts]
    per_head = p_cmp.detach() @ omega  # [B, Hq, T, Ts]
    s = per_head.view(b, hkv, hq // hkv, t, ts).sum(dim=2)  # [B, Hkv, T, Ts]
    if pos is None:
        pos = torch.arange(t, device=p_cmp.device)
    pos = pos[:, None]
    j = torch.arange(ts, device=p_cmp.device)[None, :]
    current = pos // cfg.sel_block
    eligible = j <= current  # [T, Ts]
    forced = eligible & ((j < cfg.sel_init) | (j > current - cfg.sel_local))
    s = s.masked_fill(forced, float("inf")).masked_fill(~eligible, float("-inf"))
    return s.permute(0, 2, 1, 3).contiguous()  # [B, T, Hkv, Ts]


def nsa_attention_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    config: NSAConfig = NSAConfig(),  # noqa: B008 - frozen dataclass, safe default
    *,
    k_cmp: torch.Tensor | None = None,
    v_cmp: torch.Tensor | None = None,
    block_indices: torch.Tensor | None = None,
    return_aux: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, NSAAux]:
    """Reference NSA forward (spec §4.2). Same signature and outputs as ``nsa_attention``."""
    dims = check_nsa_args(q, k, v, gates, config, k_cmp, v_cmp, block_indices)
    cfg = config
    b, t, hkv, g = dims.batch, dims.seq_len, dims.hkv, dims.group
    dev = q.device
    qf = q.float().permute(0, 2, 1, 3)  # [B, Hq, T, Dk]
    # query head h uses KV head h // G: repeat_interleave expands KV heads in that order
    kf = k.float().repeat_interleave(g, dim=2).permute(0, 2, 1, 3)  # [B, Hq, T, Dk]
    vf = v.float().repeat_interleave(g, dim=2).permute(0, 2, 1, 3)  # [B, Hq, T, Dv]
    pos = torch.arange(t, device=dev)

    # --- compression ---
    if cfg.compress == "mean":
        kc, vc = compress_mean(k, cfg), compress_mean(v, cfg)  # [B, Tc, Hkv, D] fp32
    else:
        assert k_cmp is not None and v_cmp is not None
        kc, vc = k_cmp.float(), v_cmp.float()
    tc = kc.shape[1]
    kcf = kc.repeat_interleave(g, dim=2).permute(0, 2, 1, 3)  # [B, Hq, Tc, Dk]
    vcf = vc.repeat_interleave(g, dim=2).permute(0, 2, 1, 3)  # [B, Hq, Tc, Dv]

    # --- compressed branch: block i visible to t iff i·d + l − 1 ≤ t ---
    i = torch.arange(tc, device=dev)
    mask_cmp = (i[None, :] * cfg.cmp_stride + cfg.cmp_block - 1) <= pos[:, None]  # [T, Tc]
    p_cmp, lse_cmp = _masked_softmax(dims.scale * qf @ kcf.transpose(-1, -2), mask_cmp)
    o_cmp = p_cmp @ vcf  # [B, Hq, T, Dv]

    # --- scores and top-n (or the given indices, used as is) ---
    if block_indices is None:
        idx = select_blocks(block_scores(p_cmp, t, hkv, cfg), pos, cfg)  # [B, T, Hkv, n]
    else:
        idx = block_indices.to(torch.int32)

    # --- selection branch: token-level mask from the chosen blocks ---
    ts = dims.ts
    # block-level mask [B, T, Hkv, Ts + 1]; column Ts soaks up the −1 (empty) slots
    slots = torch.where(idx < 0, torch.full_like(idx, ts), idx).long()
    chosen_blk = torch.zeros((b, t, hkv, ts + 1), dtype=torch.bool, device=dev)
    chosen_blk.scatter_(-1, slots, True)
    key_block = pos // cfg.sel_block  # [T] block of each key
    chosen = chosen_blk[..., key_block]  # [B, T(query), Hkv, T(key)]
    chosen = chosen.permute(0, 2, 1, 3).repeat_interleave(g, dim=1)  # [B, Hq, T, T]
    causal = pos[None, :] <= pos[:, None]  # [T, T]
    logits = dims.scale * qf @ kf.transpose(-1, -2)  # [B, Hq, T, T], shared by slc and win
    p_slc, lse_slc = _masked_softmax(logits, chosen & causal)
    o_slc = p_slc @ vf

    # --- window branch: keys [max(0, t−w+1), t] ---
    mask_win = causal & (pos[None, :] > pos[:, None] - cfg.window)
    p_win, lse_win = _masked_softmax(logits, mask_win)
    o_win = p_win @ vf

    # --- gated sum in fp32, one cast at the end ---
    gf = gates.float().permute(0, 2, 1, 3)  # [B, Hq, T, 3]
    out = gf[..., 0:1] * o_cmp + gf[..., 1:2] * o_slc + gf[..., 2:3] * o_win
    out = out.permute(0, 2, 1, 3).contiguous().to(q.dtype)  # [B, T, Hq, Dv]
    if not return_aux:
        return out

    def bthd(x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 1, 3).contiguous()

    def bth(x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 1).contiguous()

    aux = NSAAux(
        block_indices=idx.contiguous(),
        lse_cmp=bth(lse_cmp),
        lse_slc=bth(lse_slc),
        lse_win=bth(lse_win),
        o_cmp=bthd(o_cmp),
        o_slc=bthd(o_slc),
        o_win=bthd(o_win),
    )
    return out, aux
