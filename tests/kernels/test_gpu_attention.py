"""GPU checks at real sizes (H200 class): Triton kernel in both load paths, the PyTorch fused
backends used by the rings, and the simulated ring, against fp32 references. Skips without CUDA."""

from __future__ import annotations

import pytest
import torch

from kernels.attention import block_attention
from kernels.attention.backends import fused_backend_ok, run_block
from kernels.attention.block_attention import block_attention_triton
from kernels.attention.naive import block_attention_naive
from kernels.ring import ring_attention
from tests.kernels.conftest import assert_attention_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _rand(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(dtype)


def _reference(q, k, v, *, causal, q_offset=0, k_offset=0, chunk=2048):
    """fp32 reference, chunked over queries so long sequences fit (offsets keep the mask exact)."""
    outs, lses = [], []
    for s in range(0, q.shape[1], chunk):
        o, l = block_attention_naive(
            q[:, s : s + chunk].float(),
            k.float(),
            v.float(),
            causal=causal,
            q_offset=q_offset + s,
            k_offset=k_offset,
        )
        outs.append(o)
        lses.append(l)
    return torch.cat(outs, 1), torch.cat(lses, 2)


# (B, Tq, Tk, Hq, Hkv, D, q_offset, k_offset)
SHAPES = [
    (2, 4096, 4096, 16, 4, 128, 0, 0),
    (1, 3001, 5003, 8, 1, 128, 2500, 0),  # MQA, odd lengths, offsets
    (1, 2048, 2048, 8, 8, 64, 0, 1024),  # first half of the rows see nothing
    (1, 777, 1000, 4, 2, 96, 300, 300),  # padded head dim
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("use_tma", [True, False], ids=["tma", "ptr"])
def test_triton_kernel_gpu(shape, causal, use_tma, dtype=torch.bfloat16):
    b, tq, tk, hq, hkv, d, qo, ko = shape
    if use_tma and (torch.cuda.get_device_capability()[0] < 9 or d & (d - 1)):
        pytest.skip("TMA needs sm_90 and a power-of-two head dim")
    q, k, v = (
        _rand(b, tq, hq, d, dtype=dtype, seed=1),
        _rand(b, tk, hkv, d, dtype=dtype, seed=2),
        _rand(b, tk, hkv, d, dtype=dtype, seed=3),
    )
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, hq, tq), float("nan"), device="cuda")
    # One pinned config: autotuning every shape here would compile dozens of variants.
    block_attention_triton(
        q,
        k,
        v,
        causal=causal,
        q_offset=qo,
        k_offset=ko,
        scale=d**-0.5,
        use_tma=use_tma,
        block_m=128,
        block_n=64,
        num_warps=8,
        num_stages=3,
        out=out,
        lse=lse,
    )
    assert_attention_close(out, lse, *_reference(q, k, v, causal=causal, q_offset=qo, k_offset=ko))


def test_autotuned_fp16_gpu():
    q, k, v = (_rand(1, 2000, 8, 128, dtype=torch.float16, seed=s) for s in range(3))
    for causal in (True, False):
        out, lse = block_attention(q, k, v, causal=causal)
        assert_attention_close(out, lse, *_reference(q, k, v, causal=causal))


def test_public_api_fp32_gpu():
    q, k, v = (_rand(1, 700, 4, 64, dtype=torch.float32, seed=s) for s in range(3))
    out, lse = block_attention(q, k, v, causal=True, q_offset=100, k_offset=0)
    assert_attention_close(out, lse, *_reference(q, k, v, causal=True, q_offset=100))


@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_fused_backends_match(backend):
    if not fused_backend_ok(backend, torch.bfloat16, 128, torch.device("cuda")):
        pytest.skip(f"PyTorch {backend} attention not usable here")
    q, k, v = (_rand(1, 4096, 8, 128, seed=s) for s in range(3))
    for causal in (True, False):
        out, lse = run_block(
            q, k, v, causal=causal, q_offset=0, k_offset=0, scale=128**-0.5, backend=backend
        )
        assert_attention_close(out, lse, *_reference(q, k, v, causal=causal))


_REF_CACHE: dict[int, tuple[torch.Tensor, ...]] = {}


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "stripe"])
@pytest.mark.parametrize("backend", ["triton", "auto"])
def test_ring_simulation_gpu(world_size, layout, backend):
    t = 16384
    q, k, v = _rand(1, t, 32, 128, seed=4), _rand(1, t, 8, 128, seed=5), _rand(1, t, 8, 128, seed=6)
    out, lse = ring_attention(
        q, k, v, causal=True, world_size=world_size, layout=layout, backend=backend
    )
    if t not in _REF_CACHE:
        _REF_CACHE[t] = _reference(q, k, v, causal=True, chunk=1024)
    assert_attention_close(out, lse, *_REF_CACHE[t])


# (B, T, Hq, Hkv, D): odd lengths leave partial query and key tiles; GQA and MQA map heads.
GLUON_SHAPES = [
    (2, 4096, 16, 4, 128),
    (1, 3001, 8, 1, 128),
    (2, 1000, 4, 4, 64),
    (1, 129, 2, 1, 128),
]
# (block_n, stages): both timed candidates, the 64-key tiles, and None (picked by timing).
GLUON_CONFIGS = [(128, 2), (128, 3), (64, 2), (64, 4), (None, None)]
needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="the Gluon kernel needs sm_90",
)


def _check_gluon(b, tq, tk, hq, hkv, d, causal, qo, ko, config, seed):
    """The Gluon kernel into NaN-poisoned buffers against the fp32 reference."""
    from kernels.attention.gluon_fwd import block_attention_gluon

    q, k, v = (
        _rand(b, tq, hq, d, seed=seed),
        _rand(b, tk, hkv, d, seed=seed + 1),
        _rand(b, tk, hkv, d, seed=seed + 2),
    )
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, hq, tq), float("nan"), device="cuda")
    block_attention_gluon(
        q, k, v, causal=causal, q_offset=qo, k_offset=ko,
        block_n=config[0], stages=config[1], out=out, lse=lse,
    )  # fmt: skip
    assert_attention_close(out, lse, *_reference(q, k, v, causal=causal, q_offset=qo, k_offset=ko))


@needs_hopper
@pytest.mark.parametrize("shape", GLUON_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("config", GLUON_CONFIGS, ids=lambda c: "n{}s{}".format(*c))
def test_gluon_kernel_gpu(shape, causal, config):
    b, t, hq, hkv, d = shape
    _check_gluon(b, t, t, hq, hkv, d, causal, 0, 0, config, seed=1)


# (B, Tq, Tk, Hq, Hkv, D, causal, q_offset, k_offset): the ring's blocks. A zigzag step's
# fused diagonal (Tk = 2 Tq, shift Tq), its one-chunk blocks both ways, a partial shift, and a
# local diagonal at a global position.
GLUON_BLOCKS = [
    (1, 4096, 8192, 8, 2, 128, True, 4096, 0),
    (2, 3001, 1500, 4, 4, 128, False, 0, 0),
    (1, 1000, 3001, 4, 1, 64, False, 0, 0),
    (1, 777, 1000, 4, 2, 128, True, 300, 0),
    (2, 2048, 2048, 4, 4, 128, True, 5000, 5000),
]


@needs_hopper
@pytest.mark.parametrize("blk", GLUON_BLOCKS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config", [(128, 2), (64, 2), (None, None)], ids=str)
def test_gluon_kernel_ring_blocks_gpu(blk, config):
    _check_gluon(*blk, config, seed=4)


@needs_hopper
def test_block_attention_routes_to_gluon_gpu(monkeypatch):
    """The public function takes the Gluon kernel where it applies and the Triton one elsewhere."""
    import kernels.attention.gluon_fwd as gluon_fwd

    calls = []
    real = gluon_fwd.block_attention_gluon
    monkeypatch.setattr(
        gluon_fwd, "block_attention_gluon", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    q, k, v = (_rand(1, 777, 4, 128, seed=s) for s in range(3))
    for causal, qo, ko in ((True, 0, 0), (False, 5, 0), (True, 100, 0), (True, 0, 100)):
        out, lse = block_attention(q, k, v, causal=causal, q_offset=qo, k_offset=ko)
        assert_attention_close(
            out, lse, *_reference(q, k, v, causal=causal, q_offset=qo, k_offset=ko)
        )
    # The last call's first 100 rows see no key: the Triton kernel's case.
    assert len(calls) == 3, "unmasked and q_offset >= k_offset causal blocks go to Gluon"
