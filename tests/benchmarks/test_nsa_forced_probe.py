"""benchmarks/nsa_forced_probe.py's split of the top-n lists, on the naive reference's picks."""

from __future__ import annotations

import torch

from benchmarks.nsa_forced_probe import split_forced
from kernels.nsa.config import NSAConfig
from kernels.nsa.naive import nsa_attention_naive

CFG = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=6, window=32)


def test_split_forced_parts_are_the_forced_blocks_and_the_rest() -> None:
    gen = torch.Generator().manual_seed(0)
    t, hq, hkv, d = 203, 4, 2, 16
    q, k, v = (torch.randn(1, t, h, d, generator=gen) for h in (hq, hkv, hkv))
    gates = torch.rand(1, t, hq, 3, generator=gen)
    _, aux = nsa_attention_naive(q, k, v, gates, CFG, return_aux=True)
    idx = aux.block_indices  # [1, T, Hkv, n]
    picked, forced = split_forced(idx, CFG)
    f = CFG.sel_init + CFG.sel_local
    assert picked.shape[-1] == CFG.sel_count - f and forced.shape[-1] == f
    assert picked.dtype == forced.dtype == torch.int32
    for pos in range(t):
        cur = pos // CFG.sel_block
        want = {j for j in range(cur + 1) if j < CFG.sel_init or j > cur - CFG.sel_local}
        for h in range(hkv):
            row = [int(x) for x in idx[0, pos, h] if x >= 0]
            got_f = [int(x) for x in forced[0, pos, h]]
            got_p = [int(x) for x in picked[0, pos, h]]
            # ascending, −1 padded at the end
            for got in (got_f, got_p):
                valid = [x for x in got if x >= 0]
                assert got == valid + [-1] * (len(got) - len(valid))
                assert valid == sorted(valid)
            assert set(got_f) - {-1} == want  # the top-n always keeps its forced blocks
            assert sorted(set(got_f + got_p) - {-1}) == row
            assert not (set(got_f) & set(got_p)) - {-1}
