"""Hand-checked facts about the naive NSA reference, and argument validation."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.nsa import NSAConfig, nsa_attention, nsa_attention_naive, num_cmp_blocks
from kernels.nsa.config import num_sel_blocks, omega_band, omega_matrix
from kernels.nsa.naive import compress_mean, select_blocks
from tests.kernels.test_nsa_utils import MID, SMALL, make_inputs


def test_paper_defaults() -> None:
    c = NSAConfig()
    assert (c.cmp_block, c.cmp_stride, c.sel_block, c.sel_count) == (32, 16, 64, 16)
    assert (c.sel_init, c.sel_local, c.window, c.scale, c.compress) == (1, 2, 512, None, "mean")


@pytest.mark.parametrize(
    ("t", "tc"), [(1, 0), (31, 0), (32, 1), (47, 1), (48, 2), (77, 3), (65536, 4095)]
)
def test_tc_formula(t: int, tc: int) -> None:
    assert num_cmp_blocks(t, NSAConfig()) == tc  # ⌊(T−32)/16⌋ + 1, 0 below l


def test_ts_formula() -> None:
    assert [num_sel_blocks(t, NSAConfig()) for t in (1, 64, 65, 128, 65536)] == [1, 1, 2, 2, 1024]


def test_omega_weights_paper() -> None:
    om = omega_matrix(20, 5, NSAConfig())
    # blocks 4j−1 … 4j+3 get 1, 2, 2, 2, 1 for selection block j
    for j in range(1, 4):
        col = om[:, j]
        assert col[4 * j - 1 : 4 * j + 4].tolist() == [1.0, 2.0, 2.0, 2.0, 1.0]
        assert col.sum().item() == 8.0  # = l′·l/d / d … every token counted l/d times
    assert om[0:4, 0].tolist() == [2.0, 2.0, 2.0, 1.0]
    wa, wb = omega_band(NSAConfig())
    assert wa == [2.0, 2.0, 2.0, 1.0] and wb == [0.0, 0.0, 0.0, 1.0]


def test_compress_mean_by_hand() -> None:
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, sel_count=1, sel_init=0, sel_local=0)
    k = torch.arange(9, dtype=torch.float32).view(1, 9, 1, 1)
    kc = compress_mean(k, cfg)  # blocks [0,4), [2,6), [4,8) → means 1.5, 3.5, 5.5
    assert kc.flatten().tolist() == [1.5, 3.5, 5.5]


def test_topn_ties_go_to_smaller_index_and_forced_blocks() -> None:
    cfg = NSAConfig(sel_block=4, cmp_block=4, cmp_stride=2, sel_count=3, sel_init=1, sel_local=1)
    # one row at t = 27 → current block 6; eligible 0..6; forced {0, 6}
    s = torch.tensor([0.5, 0.9, 0.9, 0.3, 0.9, 0.1, 0.2, -1.0])
    s = s.masked_fill(torch.arange(8) > 6, float("-inf"))
    s[0] = s[6] = float("inf")
    idx = select_blocks(s.view(1, 1, 1, 8), torch.tensor([27]), cfg)
    assert idx.flatten().tolist() == [0, 1, 6]  # tie 1/2/4 at 0.9 → 1 wins
    # early row t = 5 (block 1): only 2 eligible → one −1 pad
    s2 = torch.tensor([float("inf"), float("inf"), float("-inf")])
    idx2 = select_blocks(s2.view(1, 1, 1, 3), torch.tensor([5]), cfg)
    assert idx2.flatten().tolist() == [0, 1, -1]


def test_forced_blocks_selected_even_when_scores_low() -> None:
    cfg = MID
    q, k, v, gates = make_inputs(1, 200, 2, 1, 16, torch.float32, seed=1)
    _, aux = nsa_attention_naive(q, k, v, gates, cfg, return_aux=True)
    idx = aux.block_indices[0, :, 0]
    for t in range(200):
        got = set(idx[t].tolist()) - {-1}
        cur = t // cfg.sel_block
        assert 0 in got and cur in got and (cur - 1 in got or cur == 0)
        assert len(got) == min(cfg.sel_count, cur + 1)
        row = idx[t].tolist()
        real = [j for j in row if j >= 0]
        assert real == sorted(real) and row[len(real) :] == [-1] * (len(row) - len(real))


def _brute_force(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, cfg: NSAConfig
) -> torch.Tensor:
    """Per-row loops straight from spec §4.2 (tiny sizes only)."""
    _, t, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    scale = 1 / math.sqrt(d)
    l, st, lp, n = cfg.cmp_block, cfg.cmp_stride, cfg.sel_block, cfg.sel_count
    tc = num_cmp_blocks(t, cfg)
    ts = num_sel_blocks(t, cfg)
    kc = [k[0, i * st : i * st + l].mean(0) for i in range(tc)]
    vc = [v[0, i * st : i * st + l].mean(0) for i in range(tc)]
    out = torch.zeros(t, hq, v.shape[3], dtype=torch.float64)

    def attend(
        qv: torch.Tensor, keys: list[torch.Tensor], vals: list[torch.Tensor]
    ) -> torch.Tensor:
        if not keys:
            return torch.zeros(v.shape[3], dtype=torch.float64)
        logits = torch.stack([scale * (qv * kk).sum() for kk in keys])
        p = torch.softmax(logits, 0)
        return sum(pi * vv for pi, vv in zip(p, vals, strict=True))

    for pos in range(t):
        vis = [i for i in range(tc) if i * st + l - 1 <= pos]
        for grp in range(hkv):
            s = [0.0] * ts
            for h in range(grp * g, (grp + 1) * g):
                qv = q[0, pos, h].double()
                if vis:
                    lg = torch.stack([scale * (qv * kc[i][grp].double()).sum() for i in vis])
                    p = torch.softmax(lg, 0)
                    for pi, i in zip(p.tolist(), vis, strict=True):
                        for j in range(ts):
                            ov = min(i * st + l, (j + 1) * lp) - max(i * st, j * lp)
                            s[j] += pi * max(ov, 0) / st
            cur = pos // lp
            cand = []
            for j in range(cur + 1):
                forced = j < cfg.sel_init or j > cur - cfg.sel_local
                cand.append((-(math.inf if forced else s[j]), j))
            chosen = sorted(x[1] for x in sorted(cand)[: min(n, cur + 1)])
            keys_sel = [u for j in chosen for u in range(j * lp, (j + 1) * lp) if u <= pos]
            keys_win = list(range(max(0, pos - cfg.window + 1), pos + 1))
            for h in range(grp * g, (grp + 1) * g):
                qv = q[0, pos, h].double()
                o_c = attend(
                    qv, [kc[i][grp].double() for i in vis], [vc[i][grp].double() for i in vis]
                )
                o_s = attend(
                    qv,
                    [k[0, u, grp].double() for u in keys_sel],
                    [v[0, u, grp].double() for u in keys_sel],
                )
                o_w = attend(
                    qv,
                    [k[0, u, grp].double() for u in keys_win],
                    [v[0, u, grp].double() for u in keys_win],
                )
                gg = gates[0, pos, h].double()
                out[pos, h] = gg[0] * o_c + gg[1] * o_s + gg[2] * o_w
    return out


def test_naive_matches_brute_force_loops() -> None:
    cfg = SMALL
    q, k, v, gates = make_inputs(1, 45, 4, 2, 8, torch.float32, seed=5)
    ref = nsa_attention_naive(q, k, v, gates, cfg)
    brute = _brute_force(q, k, v, gates, cfg)
    assert torch.allclose(ref.double()[0], brute, atol=1e-5, rtol=1e-5)


def test_empty_rows_give_zero_and_minus_inf() -> None:
    cfg = NSAConfig(window=4)
    q, k, v, gates = make_inputs(1, 20, 2, 1, 16, torch.float32)  # T < l: no compressed block
    out, aux = nsa_attention_naive(q, k, v, gates, cfg, return_aux=True)
    assert torch.isinf(aux.lse_cmp).all() and (aux.lse_cmp < 0).all()
    assert aux.o_cmp is not None and (aux.o_cmp == 0).all()
    assert not torch.isnan(out).any()
    # given indices with every slot empty → selection branch empty too
    idx = torch.full((1, 20, 1, cfg.sel_count), -1, dtype=torch.int32)
    out2, aux2 = nsa_attention(q, k, v, gates, cfg, block_indices=idx, return_aux=True)
    assert torch.isinf(aux2.lse_slc).all() and not torch.isnan(out2).any()
    assert aux2.o_slc is not None and (aux2.o_slc == 0).all()


# ---------------------------------------------------------------- argument validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cmp_block": 24, "cmp_stride": 16}, "multiple of cmp_stride"),
        ({"sel_block": 40}, "sel_block"),
        ({"cmp_block": 128, "sel_block": 64}, "<= sel_block"),
        ({"sel_count": 2}, "forced blocks"),
        ({"window": 0}, "window"),
        ({"scale": -1.0}, "scale"),
        ({"compress": "linear"}, "compress"),
        ({"sel_init": -1}, "sel_init"),
    ],
)
def test_config_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NSAConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("fn", [nsa_attention, nsa_attention_naive])
def test_argument_errors(fn: object) -> None:
    q, k, v, gates = make_inputs(1, 40, 4, 2, 16, torch.float32)
    call = fn  # type: ignore[assignment]
    with pytest.raises(ValueError, match="G = Hq/Hkv"):
        q3, k3, v3, g3 = make_inputs(1, 40, 3, 1, 16, torch.float32)
        call(q3, k3, v3, g3)
    with pytest.raises(ValueError, match="gates must have shape"):
        call(q, k, v, gates[..., :2])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        call(q, k, v, gates * 3)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        call(q, k, v, gates - 1.5)
    with pytest.raises(ValueError, match="NaN"):
        call(q, k, v, gates.masked_fill(gates > 0.5, float("nan")))
    with pytest.raises(ValueError, match="dtype"):
        call(q.half(), k, v, gates)
    with pytest.raises(ValueError, match="same length"):
        call(q, k[:, :30], v[:, :30], gates)
    with pytest.raises(ValueError, match="NSAConfig"):
        call(q, k, v, gates, {"window": 3})
    with pytest.raises(ValueError, match="only accepted"):
        call(q, k, v, gates, k_cmp=k[:, :1], v_cmp=v[:, :1])
    given = NSAConfig(compress="given")
    with pytest.raises(ValueError, match="requires both"):
        call(q, k, v, gates, given, k_cmp=k[:, :1])
    with pytest.raises(ValueError, match="Tc"):
        call(q, k, v, gates, given, k_cmp=k[:, :3], v_cmp=v[:, :3])
    n = NSAConfig().sel_count
    bad = torch.zeros((1, 40, 2, n), dtype=torch.int32)
    with pytest.raises(ValueError, match="repeat"):
        call(q, k, v, gates, block_indices=bad)
    bad = torch.full((1, 40, 2, n), -1, dtype=torch.int32)
    bad[0, 3, 0, 0] = 1  # block 1 is not eligible at t = 3
    with pytest.raises(ValueError, match="eligible"):
        call(q, k, v, gates, block_indices=bad)
    with pytest.raises(ValueError, match="int32 or int64"):
        call(q, k, v, gates, block_indices=bad.float())
    with pytest.raises(ValueError, match="shape"):
        call(q, k, v, gates, block_indices=bad[..., :3])


def test_inputs_not_modified() -> None:
    q, k, v, gates = make_inputs(1, 70, 4, 2, 16, torch.float32)
    copies = [x.clone() for x in (q, k, v, gates)]
    nsa_attention(q, k, v, gates, MID)
    for a, b in zip((q, k, v, gates), copies, strict=True):
        assert torch.equal(a, b)
