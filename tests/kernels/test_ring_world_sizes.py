"""The real per-rank ring with 4 and 8 gloo ranks on CPU (issue 20): every rank's out and lse
against its shard of single-process naive attention over the whole sequence.

Tiny shapes, odd ones included where the layout allows (one row per chunk, odd chunk lengths,
odd head dims, a GQA group of 3, B=2), every layout, causal and not, fp32 and bf16; the 8-rank
run also drives two concurrent 4-rank rings over interleaved sub-groups (global ranks 0,2,4,6
and 1,3,5,7: the group-rank to global-rank mapping of the ring's neighbours).

Ranks start from a forkserver that has torch and the kernels imported already
(tests/kernels/gloo.py): CI has two cores, and eight spawned interpreters each importing torch
cost 10-20 s there, against about a second for the rings themselves.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.kernels.gloo import init_rank, launch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available(), reason="no torch.distributed"),
]

#: (B, chunk, Hq, Hkv, D, dtype): the global length is ``chunk`` times the layout's number of
#: chunks (2P for zigzag, P otherwise), so every layout gets the same per-chunk sizes.
CASES = [
    (1, 1, 2, 1, 8, torch.float32),  # one row per chunk: contiguous and stripe shards of length 1
    (1, 3, 3, 3, 5, torch.float32),  # odd chunk length and odd head dim
    (2, 4, 6, 2, 16, torch.float32),  # batch 2, GQA group of 3
    (2, 4, 6, 2, 16, torch.bfloat16),  # out in bf16, lse in fp32
]


def _check_ring(
    rank: int,
    world: int,
    group: dist.ProcessGroup | None,
    seed: int,
    cases: list[tuple[int, int, int, int, int, torch.dtype]],
) -> int:
    """Run every case with every layout, causal and not, on this rank; the rings checked."""
    from kernels.attention.naive import attention_naive
    from kernels.ring import LAYOUTS, ring_attention_local, shard
    from tests.kernels.conftest import assert_attention_close

    gen = torch.Generator().manual_seed(seed)  # the same global tensors on every rank
    done = 0
    for b, chunk, hq, hkv, d, dtype in cases:
        for layout in LAYOUTS:
            t = chunk * (2 * world if layout == "zigzag" else world)
            q = torch.randn(b, t, hq, d, generator=gen).to(dtype)  # [B, T, Hq, D]
            k = torch.randn(b, t, hkv, d, generator=gen).to(dtype)  # [B, T, Hkv, D]
            v = torch.randn(b, t, hkv, d, generator=gen).to(dtype)
            mine = [shard(x, rank, world, layout) for x in (q, k, v)]
            before = [x.clone() for x in mine]
            for causal in (True, False):
                # fp32 reference from the (rounded) inputs: only the ring's own error is judged
                ref_out, ref_lse = attention_naive(q.float(), k.float(), v.float(), causal=causal)
                out, lse = ring_attention_local(*mine, causal=causal, group=group, layout=layout)
                where = f"P={world} {layout} causal={causal} {dtype} B{b} c{chunk} rank {rank}"
                assert all(torch.equal(x, y) for x, y in zip(mine, before, strict=True)), (
                    f"{where}: input modified"
                )
                assert out.dtype == dtype and out.shape == mine[0].shape, where
                try:
                    assert_attention_close(
                        out,
                        lse,
                        shard(ref_out, rank, world, layout),
                        shard(ref_lse, rank, world, layout, dim=2),
                    )
                except AssertionError as e:
                    raise AssertionError(f"{where}: {e}") from None
                done += 1
    return done


def _rank_main(rank: int, world: int, port: int) -> None:
    init_rank(rank, world, port)
    try:
        n = _check_ring(rank, world, None, world, CASES)
        assert n == len(CASES) * 3 * 2, n
        if world == 8:
            # Every rank creates every group, in the same order (torch.distributed's rule).
            evens, odds = dist.new_group([0, 2, 4, 6]), dist.new_group([1, 3, 5, 7])
            mine = evens if rank % 2 == 0 else odds
            assert dist.get_world_size(mine) == 4
            # Both sub-rings run at once over the same transport, on different global peers.
            _check_ring(dist.get_rank(mine), 4, mine, 100 + rank % 2, CASES[1:2])
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [4, 8])
def test_ring_attention_local_gloo_world(world: int) -> None:
    launch(_rank_main, world)
