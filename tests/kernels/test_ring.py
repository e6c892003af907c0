"""Ring layouts, the step schedule and the single-process ring simulation."""

from __future__ import annotations

import itertools

import pytest
import torch

from kernels.attention.naive import attention_naive
from kernels.ring import LAYOUTS, positions, ring_attention, shard, unshard
from kernels.ring.schedule import plan_step
from tests.kernels.conftest import assert_attention_close, randn


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shard_unshard_roundtrip_and_positions(layout, world_size):
    t = 24
    x = torch.arange(2 * t * 3).reshape(2, t, 3)
    parts = [shard(x, r, world_size, layout) for r in range(world_size)]
    assert torch.equal(unshard(parts, world_size, layout), x)
    allpos = torch.cat([positions(t, r, world_size, layout) for r in range(world_size)])
    assert sorted(allpos.tolist()) == list(range(t)), "each token on exactly one rank"
    for r, p in enumerate(parts):
        assert p.is_contiguous()
        assert torch.equal(p, x[:, positions(t, r, world_size, layout)])
    lse = torch.randn(2, 3, t)
    lparts = [shard(lse, r, world_size, layout, dim=2) for r in range(world_size)]
    assert torch.equal(unshard(lparts, world_size, layout, dim=2), lse)


def test_layout_positions_spec_examples():
    assert positions(8, 1, 2, "zigzag").tolist() == [2, 3, 4, 5]
    assert positions(8, 0, 2, "zigzag").tolist() == [0, 1, 6, 7]
    assert positions(8, 1, 2, "stripe").tolist() == [1, 3, 5, 7]
    assert positions(8, 1, 2, "contiguous").tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("fuse", [True, False])
def test_plan_covers_exactly_the_causal_mask(layout, world_size, fuse):
    """Union over steps of the planned blocks (with their masks) == the causal mask, no overlap."""
    t = 48
    n = t // world_size
    for r, src in itertools.product(range(world_size), repeat=2):
        qpos = positions(t, r, world_size, layout)
        kpos = positions(t, src, world_size, layout)
        want = qpos[:, None] >= kpos[None, :]  # [n, n] global causal mask
        got = torch.zeros(n, n, dtype=torch.int64)
        for blk in plan_step(r, src, world_size, n, layout, True, fuse=fuse):
            i = torch.arange(blk.q0, blk.q1)[:, None]
            j = torch.arange(blk.k0, blk.k1)[None, :]
            if blk.causal:
                vis = (blk.q_offset + (i - blk.q0)) >= (blk.k_offset + (j - blk.k0))
            else:
                vis = torch.ones(blk.q1 - blk.q0, blk.k1 - blk.k0, dtype=torch.bool)
            assert vis.any(), "a planned block must not be fully masked"
            got[blk.q0 : blk.q1, blk.k0 : blk.k1] += vis.long()
        assert torch.equal(got, want.long()), (layout, world_size, r, src)


@pytest.mark.parametrize("p", [4, 8])
def test_zigzag_balances_work_after_step_zero(p):
    n = 64
    for s in range(1, p):
        work = []
        for r in range(p):
            blocks = plan_step(r, (r - s) % p, p, n, "zigzag", True)
            work.append(sum((b.q1 - b.q0) * (b.k1 - b.k0) for b in blocks))
        assert len(set(work)) == 1, work


CASES = [
    # (T, P, Hq, Hkv, D)
    (384, 1, 2, 1, 16),
    (384, 2, 4, 2, 64),
    (384, 3, 4, 1, 16),
    (768, 4, 4, 2, 16),
    (768, 4, 2, 2, 64),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}-P{}-H{}x{}-D{}".format(*c))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ring_attention_matches_full(case, layout, causal, dtype, gen):
    t, p, hq, hkv, d = case
    q, k, v = (
        randn(1, t, hq, d, dtype=dtype, gen=gen),
        randn(1, t, hkv, d, dtype=dtype, gen=gen),
        randn(1, t, hkv, d, dtype=dtype, gen=gen),
    )
    out, lse = ring_attention(q, k, v, causal=causal, world_size=p, layout=layout)
    ref = attention_naive(q.float(), k.float(), v.float(), causal=causal)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == (1, hq, t)
    assert_attention_close(out, lse, *ref)


def test_ring_attention_batch_and_scale(gen):
    q, k, v = (randn(2, 96, 2, 16, gen=gen) for _ in range(3))
    out, lse = ring_attention(q, k, v, causal=True, world_size=3, layout="zigzag", scale=0.2)
    assert_attention_close(out, lse, *attention_naive(q, k, v, causal=True, scale=0.2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(world_size=0, layout="zigzag"), "world_size must be >= 1"),
        (dict(world_size=2, layout="spiral"), "layout must be one of"),
        (dict(world_size=5, layout="zigzag"), "divisible by 10"),
        (dict(world_size=7, layout="contiguous"), "divisible by 7"),
        (dict(world_size=2, layout="zigzag", backend="cudnn"), "needs CUDA"),
    ],
)
def test_ring_attention_errors(kwargs, match):
    q = torch.randn(1, 24, 2, 8)
    with pytest.raises(ValueError, match=match):
        ring_attention(q, q, q, causal=True, **kwargs)


def test_ring_attention_rejects_different_lengths():
    with pytest.raises(ValueError, match="same length"):
        ring_attention(
            torch.randn(1, 8, 2, 8),
            torch.randn(1, 16, 2, 8),
            torch.randn(1, 16, 2, 8),
            causal=True,
            world_size=2,
        )


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: shard(torch.zeros(1, 10, 2), 0, 3, "contiguous"), "divisible by 3"),
        (
            lambda: shard(torch.zeros(1, 12, 2), 3, 3, "zigzag"),
            r"rank must be in \[0, world_size=3\)",
        ),
        (lambda: shard(torch.zeros(1, 12, 2), 0, 3, "zigzag", dim=5), "dim 5 is out of range"),
        (lambda: unshard([torch.zeros(1, 4)], 2, "stripe"), "world_size=2 tensors"),
        (
            lambda: unshard([torch.zeros(1, 4), torch.zeros(1, 5)], 2, "stripe"),
            r"parts\[1\] must be a tensor of shape",
        ),
        (lambda: positions(12, 0, 2, "diagonal"), "layout must be one of"),
    ],
)
def test_layout_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
