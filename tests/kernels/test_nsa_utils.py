"""Shared NSA test helpers (inputs, planted scores, comparisons) plus checks of the helpers.

Imported by the other test_nsa*.py modules and by the TRITON_INTERPRET=1 subprocess.
"""

from __future__ import annotations

import math

import torch

from kernels.nsa import NSAAux, NSAConfig, nsa_attention_naive
from kernels.nsa.config import num_sel_blocks

# Small configurations keep the interpreter fast; PAPER is the spec default.
PAPER = NSAConfig()
SMALL = NSAConfig(
    cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, sel_init=1, sel_local=1, window=24
)
MID = NSAConfig(
    cmp_block=16, cmp_stride=8, sel_block=32, sel_count=5, sel_init=1, sel_local=2, window=40
)

GATE_PATTERNS = {
    "cmp": (1.0, 0.0, 0.0),
    "slc": (0.0, 1.0, 0.0),
    "win": (0.0, 0.0, 1.0),
}


def make_inputs(
    b: int,
    t: int,
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    *,
    seed: int = 0,
    gates: str | None = None,
    dv: int | None = None,
    device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q, k, v (dtype) and gates (fp32); gates=name gives a one-hot pattern."""
    gen = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    q = torch.randn(b, t, hq, d, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(b, t, hkv, d, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(b, t, hkv, dv, generator=gen).to(device=device, dtype=dtype)
    if gates is None:
        g = torch.rand(b, t, hq, 3, generator=gen)
    else:
        g = torch.tensor(GATE_PATTERNS[gates]).expand(b, t, hq, 3).contiguous()
    return q, k, v, g.to(device)


def forced_set(t: int, cfg: NSAConfig) -> set[int]:
    cur = t // cfg.sel_block
    return {j for j in range(cur + 1) if j < cfg.sel_init or j > cur - cfg.sel_local}


def planted_inputs(
    t: int,
    hq: int,
    hkv: int,
    d: int,
    cfg: NSAConfig,
    dtype: torch.dtype,
    *,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[list[set[int]]]]:
    """Inputs whose top-n is unambiguous (staged protocol step 1).

    Keys of selection block j point along e_j (D ≥ Ts); query (t, g) sums e_j over a chosen
    set S(t, g) of non-forced eligible blocks, sized so forced ∪ S has exactly
    min(n, eligible) blocks. Logits on chosen blocks are ≈ 30 above the rest, so every score
    outside forced ∪ S is ≈ e^-30 of the chosen ones. Returns (q, k, v, gates, expected).
    """
    ts = num_sel_blocks(t, cfg)
    if d < ts:
        raise ValueError(f"planted inputs need D >= Ts ({ts}), got {d}")
    gen = torch.Generator().manual_seed(seed)
    g_ = hq // hkv
    key_dir = torch.zeros(t, d)
    key_dir[torch.arange(t), torch.arange(t) // cfg.sel_block] = 1.0
    k = 4.0 * key_dir[None, :, None, :].expand(1, t, hkv, d).clone()
    k += 0.01 * torch.randn(1, t, hkv, d, generator=gen)
    v = torch.randn(1, t, hkv, d, generator=gen)
    q = torch.zeros(1, t, hq, d)
    alpha = 30.0 / (4.0 / math.sqrt(d))  # scale·α·β ≈ 30
    expected: list[list[set[int]]] = []
    for pos in range(t):
        row: list[set[int]] = []
        forced = forced_set(pos, cfg)
        eligible = pos // cfg.sel_block + 1
        want = min(cfg.sel_count, eligible) - len(forced)
        pool = [j for j in range(eligible) if j not in forced]
        for g in range(hkv):
            perm = torch.randperm(len(pool), generator=gen).tolist()
            chosen = {pool[i] for i in perm[:want]}
            row.append(forced | chosen)
            for j in chosen:
                q[0, pos, g * g_ : (g + 1) * g_, j] = alpha
        expected.append(row)
    q += 0.01 * torch.randn(1, t, hq, d, generator=gen)
    gates = torch.rand(1, t, hq, 3, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype), gates, expected


def assert_rounds_alike(
    got: torch.Tensor, ref: torch.Tensor, spread: torch.Tensor | float = 0.0
) -> None:
    """got is ref up to rounding, as two kernels are that add the same terms in another order
    or let the compiler fuse a multiply-add the other skips: fp32 to 1e-5, a 16-bit store by
    at most its dtype's eps times the value (a unit or two in its last place).

    spread: how far rounding an intermediate to 16 bits may move each element on top of that
    (broadcast against ref). An fp32 ``p @ v`` whose p is cast to bf16 first is one: where p
    differs in its last fp32 bit the cast can flip by one bf16 unit, eps·p, so the sum moves by
    up to eps · Σ p·|v|, whatever the output's own dtype."""
    rtol = 1e-5 if ref.dtype == torch.float32 else torch.finfo(ref.dtype).eps
    bound = rtol * ref.float().abs() + 1e-5 + spread
    excess = (got.float() - ref.float()).abs() - bound
    bad = int((excess > 0).sum())
    assert bad == 0, (
        f"{bad} elements differ by more than rounding (the worst by {excess.max().item():.3g}"
        " past its bound)"
    )


def err_ratio(x: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    den = ref.pow(2).mean().sqrt().item()
    num = (x.double() - ref).pow(2).mean().sqrt().item()
    return num / max(den, 1e-30)


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    cfg: NSAConfig,
    **kw: object,
) -> tuple[torch.Tensor, NSAAux]:
    """Naive reference in fp32 on the same (already rounded) inputs."""
    extra = {
        name: (x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
        for name, x in kw.items()
    }
    out, aux = nsa_attention_naive(
        q.float(), k.float(), v.float(), gates, cfg, return_aux=True, **extra
    )  # type: ignore[arg-type]
    return out, aux


def assert_lse_close(x: torch.Tensor, ref: torch.Tensor, atol: float, what: str) -> None:
    assert not torch.isnan(x).any(), f"{what}: NaN"
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(x), fin), f"{what}: −inf pattern differs"
    assert torch.equal(x[~fin], ref[~fin]), f"{what}: wrong infinities"
    if fin.any():
        diff = (x[fin] - ref[fin]).abs().max().item()
        assert diff <= atol, f"{what}: max |Δlse| {diff:.3e} > {atol}"


def assert_matches(
    out: torch.Tensor,
    aux: NSAAux,
    ref_out: torch.Tensor,
    ref_aux: NSAAux,
    dtype: torch.dtype,
    *,
    check_indices: bool = True,
) -> None:
    """Stage-2 tolerances (fp32 inputs: far tighter)."""
    tight = dtype == torch.float32
    assert out.dtype == dtype
    assert not torch.isnan(out).any(), "NaN in out"
    if check_indices:
        assert torch.equal(aux.block_indices, ref_aux.block_indices), "block_indices differ"
    assert aux.block_indices.dtype == torch.int32
    limit = 1e-5 if tight else 5e-3
    er = err_ratio(out, ref_out)
    assert er <= limit, f"out err_ratio {er:.3e} > {limit}"
    atol = 1e-4 if tight else 1e-2
    assert torch.allclose(out.float(), ref_out, atol=atol, rtol=atol)
    lse_tol = 1e-4 if tight else 1e-3
    for name in ("lse_cmp", "lse_slc", "lse_win"):
        got, want = getattr(aux, name), getattr(ref_aux, name)
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        assert_lse_close(got, want, lse_tol, name)
    for name in ("o_cmp", "o_slc", "o_win"):
        got, want = getattr(aux, name), getattr(ref_aux, name)
        if got is None:
            continue
        assert not torch.isnan(got).any(), f"NaN in {name}"
        if want.abs().max() > 0:
            er = err_ratio(got, want)
            assert er <= limit, f"{name} err_ratio {er:.3e} > {limit}"
        else:
            assert got.abs().max() == 0, f"{name} should be all zero"


# ---------------------------------------------------------------- checks of the helpers


def test_planted_inputs_select_the_planted_sets() -> None:
    t, cfg = 150, MID
    q, k, v, gates, expected = planted_inputs(t, 4, 2, 32, cfg, torch.float32, seed=3)
    _, aux = nsa_attention_naive(q, k, v, gates, cfg, return_aux=True)
    idx = aux.block_indices
    for pos in range(t):
        for g in range(2):
            got = {int(j) for j in idx[0, pos, g] if j >= 0}
            assert got == expected[pos][g], (pos, g)


def test_err_ratio_basics() -> None:
    x = torch.ones(10)
    assert err_ratio(x, x) == 0.0
    assert abs(err_ratio(1.01 * x, x) - 0.01) < 1e-6
