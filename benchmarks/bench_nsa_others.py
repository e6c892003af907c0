"""NSA side by side (issue 19): ours vs fla's ``parallel_nsa`` vs XunhaoLai's kernels vs dense.

One process, one GPU, identical inputs, paper configuration: B=1, Hq=64, Hkv=4, D=128, bf16;
compression l=32 d=16, selection l'=64 n=16 (1 initial + 2 local blocks forced), window 512.
Times the forward (no grad) and, with ``--backward``, forward + backward
(``torch.autograd.grad`` w.r.t. q, k, v and the gates) of

- ours: ``kernels.nsa.nsa_attention(q, k, v, gates, NSAConfig())``;
- fla (github:fla-org/flash-linear-attention): ``fla.ops.nsa.parallel.parallel_nsa`` with
  block_size 64, block_counts 16. Its compression is a mean over non-overlapping 64-token
  blocks (l = d = l' = 64, not configurable apart from the selection block); its window
  branch calls flash-attn, so without the flash_attn package (the GPU image has none) it
  runs with window_size=0: "no window";
- XunhaoLai (github:XunhaoLai/native-sparse-attention-triton): ``avgpool_compress`` (l=32,
  d=16, the mean as ours) + ``compressed_attention`` (top-16 blocks of 64, 1 initial + 2
  local forced) + ``topk_sparse_attention`` + a 512-token sliding window, gated in PyTorch as
  its NativeSparseAttention module does. That module's window is flash-attn's; without
  flash_attn the window here is compiled FlexAttention (torch), timed alone as its own row;
- dense causal SDPA on the cuDNN backend (GQA expanded) as an anchor.

Their gates are the same values as ours in bf16 (as their layers compute them); ours take
fp32 (the values are bf16-representable, so every implementation sees identical gates).
CUDA-event medians (``triton.testing.do_bench``) after a warm-up call that compiles and
autotunes. At the smallest T it prints each implementation's output against ours (max abs
diff, rel RMS; informational: the branches differ in details), fla also against ours at
fla's own settings (compression 64/64, no window), and the share of XunhaoLai's selected
block sets equal to ours. Last, one markdown table with theirs / ours ratios.

Their code is never committed: ``benchmarks/others_setup.sh`` exports their package folders
into the git-ignored ``third_party/fla`` and ``third_party/nsa_xunhao`` (and writes the
commits used into each folder's COMMIT file). Nothing of theirs is imported at package
level: bare package modules stand in for ``fla``, ``fla.ops``, ``fla.ops.nsa``,
``native_sparse_attention`` and ``native_sparse_attention.ops`` so that their ``__init__``
files (which pull in layers, models and transformers) are not run. Both need einops (on the
GPU image already; else ``python3 -m pip install --no-index --find-links .whl einops`` with
the wheel the setup script downloads into the git-ignored ``.whl/``).

    benchmarks/others_setup.sh                            # here: third_party/ and .whl/
    python3 benchmarks/bench_nsa_others.py [--seqs 16384 32768 65536] [--backward]

On the GPU machine carry ``["third_party", ".whl"]``; the working tree there has no .git, so
pass our commit as ``KGRADE_COMMIT=<hash>`` (else it prints "unknown").

CPU smoke test (Triton interpreter; one wall-clock call per cell, minutes each; dense is
CUDA-only; the window is a masked SDPA there, FlexAttention having no CPU backward):

    TRITON_INTERPRET=1 python benchmarks/bench_nsa_others.py --device cpu --seqs 256 \\
        --hq 16 --hkv 1 --dim 32 --dtype fp16 --backward [--impls ours fla xunhao]

XunhaoLai's kernels load through block pointers, which newer Triton (3.9 was tried) no longer
has and whose bf16 loads Triton 3.6's interpreter (3.6 is the GPU machine's version) gets
wrong: interpret them with Triton 3.6, --dtype fp16 and NumPy < 2.4 (e.g. installed with
``pip install --target`` into folders put first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("NSA_AUTOTUNE", "1")  # before our kernels are imported: tune each kernel
if "--backward" in sys.argv:
    # as bench_nsa.py --backward: bound compile time, each kernel tunes over its first k configs
    _k = sys.argv[sys.argv.index("--tune-max") + 1] if "--tune-max" in sys.argv else "2"
    os.environ.setdefault("NSA_AUTOTUNE_MAX", _k)
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks._common import commit, device_ready, diff, git  # noqa: E402
from kernels.nsa import NSAConfig, nsa_attention  # noqa: E402

THIRD_PARTY = REPO / "third_party"
FLA_DIR = THIRD_PARTY / "fla"
XUNHAO_DIR = THIRD_PARTY / "nsa_xunhao"

Fn = Callable[[], object]


# ---- provenance ------------------------------------------------------------------------------


@functools.cache  # once: others commit to this repo while a long run goes on
def our_commit() -> str:
    return commit(REPO)


def our_variants() -> str:
    """The kernel variant each branch of ours runs (defaults, or KGRADE_NSA_* overrides), so a
    table timed with an opt-in variant says so."""
    from kernels.nsa.attention import DEFAULT_VARIANTS, variant

    return ", ".join(f"{b} {variant(b)}" for b in DEFAULT_VARIANTS)


def third_party_commit(folder: Path) -> str:
    """The commit others_setup.sh exported (its COMMIT file), else the folder's git HEAD."""
    stamp = folder / "COMMIT"
    if stamp.is_file():
        return stamp.read_text().strip()[:12] or "unknown"
    if folder.is_dir():
        sha = git(["rev-parse", "--short=12", "HEAD"], folder)
        if sha and git(["rev-parse", "--show-toplevel"], folder) == str(folder.resolve()):
            return sha
    return "unknown"


# ---- importing their code without running their package __init__ files -----------------------


def _bare_package(name: str, path: Path) -> None:
    """Register ``name`` as a package whose submodules load from ``path``, __init__ not run.

    fla/__init__.py and fla/ops/__init__.py import every layer, model and op (transformers
    among their needs); XunhaoLai's ops/__init__.py imports decode kernels we do not time.
    A module with ``__path__`` is all the import system needs to find the submodules.
    """
    if not path.is_dir():
        raise ModuleNotFoundError(f"{path} missing: run benchmarks/others_setup.sh first")
    existing = sys.modules.get(name)
    if existing is not None and list(getattr(existing, "__path__", [])) == [str(path)]:
        return
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__version__ = "bare"  # fla.utils._decorators reads the package's __version__
    sys.modules[name] = mod


def cpu_interpreter_shims() -> None:
    """Only for the CPU smoke test (TRITON_INTERPRET=1, no GPU); a GPU run never calls this.

    - Their @triton.autotune keeps its first config: the autotuner benchmarks configs through
      the GPU driver, which the interpreter has none of ("0 active drivers"); with one config
      it skips that step. Must run before their modules are imported (decorators run then).
      Ours pick their first config under the interpreter anyway.
    - torch.histc on an integer CPU tensor goes through float: XunhaoLai's top-k calls it on
      int64, which CUDA supports and the CPU does not ("histogram_cpu" not implemented).
    """
    if getattr(triton.autotune, "_first_config_only", False):
        return
    original = triton.autotune

    def autotune(configs: list[triton.Config], *args: object, **kwargs: object) -> object:
        return original(configs[:1], *args, **kwargs)  # type: ignore[arg-type]

    autotune._first_config_only = True  # type: ignore[attr-defined]
    triton.autotune = autotune  # type: ignore[assignment]
    histc = torch.histc

    def histc_any(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if x.is_floating_point() or x.is_cuda:
            return histc(x, *args, **kwargs)  # type: ignore[arg-type]
        return histc(x.double(), *args, **kwargs).to(x.dtype)  # type: ignore[arg-type]

    torch.histc = histc_any  # type: ignore[assignment]


def import_fla() -> types.ModuleType:
    """fla.ops.nsa.parallel (parallel_nsa), with fla, fla.ops and fla.ops.nsa as bare packages."""
    root = FLA_DIR / "fla"
    _bare_package("fla", root)
    _bare_package("fla.ops", root / "ops")
    _bare_package("fla.ops.nsa", root / "ops" / "nsa")  # its __init__ imports naive (unused)
    return importlib.import_module("fla.ops.nsa.parallel")


def import_xunhao() -> dict[str, Callable[..., object]]:
    """XunhaoLai's prefill ops from their modules, the two package __init__ files bypassed."""
    root = XUNHAO_DIR / "native_sparse_attention"
    _bare_package("native_sparse_attention", root)
    _bare_package("native_sparse_attention.ops", root / "ops")
    base = "native_sparse_attention.ops.triton."
    return {
        "avgpool_compress": importlib.import_module(base + "weighted_pool").avgpool_compress,
        "compressed_attention": importlib.import_module(
            base + "compressed_attention"
        ).compressed_attention,
        "topk_sparse_attention": importlib.import_module(
            base + "topk_sparse_attention"
        ).topk_sparse_attention,
    }


def flash_attn_window() -> Callable[..., torch.Tensor] | None:
    """flash-attn's varlen function where the package exists (the window their modules use)."""
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    return flash_attn_varlen_func  # type: ignore[no-any-return]


# ---- inputs, timing, comparison --------------------------------------------------------------


@dataclass
class Inputs:
    q: torch.Tensor  # [B, T, Hq, D] bf16
    k: torch.Tensor  # [B, T, Hkv, D]
    v: torch.Tensor
    gates: torch.Tensor  # [B, T, Hq, 3] fp32 holding bf16-representable values
    dout: torch.Tensor  # [B, T, Hq, D] upstream gradient for fwd+bwd
    cfg: NSAConfig = field(default_factory=NSAConfig)


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_inputs(b: int, t: int, hq: int, hkv: int, d: int, device: str, dt: torch.dtype) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(t)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=gen).to(dt)

    q, k, v = randn(b, t, hq, d), randn(b, t, hkv, d), randn(b, t, hkv, d)
    # rounded through dt so the dt copies the others get hold exactly the same values
    gates = torch.rand(b, t, hq, 3, device=device, generator=gen).to(dt).float()
    return Inputs(q, k, v, gates, randn(b, t, hq, d))


def leaves(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_(True) for x in xs]


class Timer:
    """CUDA-event medians via do_bench on a GPU; one wall-clock call under the CPU interpreter.

    The interpreter compiles nothing and takes seconds to minutes a call, so there one call
    is the smoke test's whole measurement.
    """

    def __init__(self, cuda: bool, warmup: int, rep: int) -> None:
        self.cuda, self.warmup, self.rep = cuda, warmup, rep

    def __call__(self, fn: Fn) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - t0)
        fn()  # first call compiles and autotunes; do_bench's own warm-up then runs warm
        torch.cuda.synchronize()
        return float(
            triton.testing.do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median")
        )


# ---- the implementations ---------------------------------------------------------------------


@dataclass
class Impl:
    """One implementation: how to build its callables on given inputs, and what it computes."""

    key: str
    label: str
    branches: str
    commit: str
    # (inputs) → {"fwd": fn, "fwd+bwd": fn, "out": fn returning the [B,T,Hq,D] output}
    build: Callable[[Inputs], dict[str, Fn]]
    error: str | None = None  # import failure: every cell FAILED


def ours_fns(x: Inputs) -> dict[str, Fn]:
    cfg = x.cfg

    def fwd() -> torch.Tensor:
        with torch.no_grad():
            return nsa_attention(x.q, x.k, x.v, x.gates, cfg)  # type: ignore[return-value]

    grads = leaves(x.q, x.k, x.v, x.gates)

    def fwd_bwd() -> object:
        out = nsa_attention(*grads, cfg)
        assert isinstance(out, torch.Tensor)
        return torch.autograd.grad(out, grads, x.dout)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd, "out": fwd}


def fla_fns(mod: types.ModuleType) -> Callable[[Inputs], dict[str, Fn]]:
    def build(x: Inputs) -> dict[str, Fn]:
        cfg = x.cfg
        # its window branch is flash-attn; none there → window 0 (and a zero window gate)
        window = cfg.window if getattr(mod, "flash_attn_func", None) is not None else 0
        # separate contiguous gate tensors, made here: its @contiguous would copy slices per call
        g = [x.gates[..., i].to(x.q.dtype).contiguous() for i in range(3)]
        kw = {"block_counts": cfg.sel_count, "block_size": cfg.sel_block, "window_size": window}

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *gs: torch.Tensor) -> object:
            g_swa = gs[2] if window else None
            return mod.parallel_nsa(q, k, v, gs[0], gs[1], g_swa, **kw)

        def fwd() -> object:
            with torch.no_grad():
                return call(x.q, x.k, x.v, *g)

        grads = leaves(x.q, x.k, x.v, *(g if window else g[:2]))

        def fwd_bwd() -> object:
            gs = [*grads[3:], g[2]]
            return torch.autograd.grad(call(*grads[:3], *gs), grads, x.dout)

        return {"fwd": fwd, "fwd+bwd": fwd_bwd, "out": fwd}

    return build


class SlidingWindow:
    """The 512-token causal window (query position included) the XunhaoLai row composes.

    flash-attn's varlen kernel where it is installed (what their module calls), else compiled
    FlexAttention; on the CPU (smoke test) a dense masked SDPA, which has a CPU backward.
    """

    def __init__(self, t: int, window: int, device: str) -> None:
        self.flash = flash_attn_window()
        self.window, self.t = window, t
        self.band: torch.Tensor | None = None
        if self.flash is not None:
            self.name = "flash-attn"
            return
        if not device.startswith("cuda"):
            pos = torch.arange(t, device=device)
            rel = pos[:, None] - pos[None, :]
            self.band = (rel >= 0) & (rel < window)  # [T, T] keys visible to each query
            self.name = "masked SDPA (CPU)"
            return
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def sliding(b: object, h: object, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
            return (qi >= ki) & (qi - ki < window)

        self.mask = create_block_mask(sliding, None, None, t, t, device=device)
        # dynamic=False: one static graph per T (a second T would otherwise recompile dynamic)
        self.flex = torch.compile(flex_attention, dynamic=False)
        self.name = "FlexAttention"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] (varlen, B=1) → [T, Hq, D]."""
        if self.flash is not None:
            cu = torch.tensor([0, self.t], dtype=torch.int32, device=q.device)
            return self.flash(
                q, k, v, cu, cu, self.t, self.t, causal=True, window_size=(self.window - 1, 0)
            )
        qh, kh, vh = (y.transpose(0, 1).unsqueeze(0) for y in (q, k, v))  # [1, H, T, D] views
        if self.band is not None:
            out = torch.nn.functional.scaled_dot_product_attention(
                qh, kh, vh, attn_mask=self.band, enable_gqa=True
            )
            return out[0].transpose(0, 1)
        out = self.flex(qh, kh, vh, block_mask=self.mask, enable_gqa=True)
        assert isinstance(out, torch.Tensor)
        return out[0].transpose(0, 1)


def xunhao_fns(
    ops: dict[str, Callable[..., object]], windows: dict[int, SlidingWindow]
) -> Callable[[Inputs], dict[str, Fn]]:
    def build(x: Inputs) -> dict[str, Fn]:
        cfg = x.cfg
        b, t, _, _ = x.q.shape
        assert b == 1, "varlen layout: B=1 is one sequence"
        cu = torch.tensor([0, t], dtype=torch.int32, device=x.q.device)
        tc = (t - cfg.cmp_block) // cfg.cmp_stride + 1 if t >= cfg.cmp_block else 0
        if t not in windows:
            windows[t] = SlidingWindow(t, cfg.window, str(x.q.device))
        window = windows[t]
        compress = ops["avgpool_compress"]
        cmp_attn = ops["compressed_attention"]
        sparse = ops["topk_sparse_attention"]

        def call(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            # [1, T, H, D] → varlen [T, H, D] views; the max lengths passed as ints, as their
            # module does once per batch, so compressed_attention needs no .item() for them
            q, k, v, g = q[0], k[0], v[0], g[0]
            kc, cu_c = compress(k, None, cu, cfg.cmp_block, cfg.cmp_stride)  # type: ignore[misc]
            vc, _ = compress(v, None, cu, cfg.cmp_block, cfg.cmp_stride)  # type: ignore[misc]
            o_cmp, idx = cmp_attn(  # type: ignore[misc]
                q,
                kc,
                vc,
                cfg.cmp_block,
                cfg.cmp_stride,
                cfg.sel_block,
                cfg.sel_count,
                cu,
                cu_c,
                t,
                tc,
                None,
                cfg.sel_init,
                cfg.sel_local,
            )
            o_slc = sparse(q, k, v, idx, cfg.sel_block, cu, None)
            o_win = window(q, k, v)
            out = g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win  # type: ignore[operator]
            return out.unsqueeze(0), idx

        gates = x.gates.to(x.q.dtype)

        def fwd() -> object:
            with torch.no_grad():
                return call(x.q, x.k, x.v, gates)[0]

        grads = leaves(x.q, x.k, x.v, gates)

        def fwd_bwd() -> object:
            return torch.autograd.grad(call(*grads)[0], grads, x.dout)

        def blocks() -> torch.Tensor:
            with torch.no_grad():
                return call(x.q, x.k, x.v, gates)[1]

        return {"fwd": fwd, "fwd+bwd": fwd_bwd, "out": fwd, "blocks": blocks}

    return build


def window_fns(windows: dict[int, SlidingWindow]) -> Callable[[Inputs], dict[str, Fn]]:
    """The XunhaoLai row's window alone, so its share of that row can be read off."""

    def build(x: Inputs) -> dict[str, Fn]:
        t = x.q.shape[1]
        if t not in windows:
            windows[t] = SlidingWindow(t, x.cfg.window, str(x.q.device))
        window = windows[t]

        def fwd() -> object:
            with torch.no_grad():
                return window(x.q[0], x.k[0], x.v[0])

        grads = leaves(x.q[0], x.k[0], x.v[0])

        def fwd_bwd() -> object:
            return torch.autograd.grad(window(*grads), grads, x.dout[0])

        return {"fwd": fwd, "fwd+bwd": fwd_bwd}

    return build


def dense_fns(x: Inputs) -> dict[str, Fn]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    if not x.q.is_cuda:
        raise RuntimeError("cuDNN SDPA needs CUDA")
    g = x.q.shape[2] // x.k.shape[2]
    # GQA expanded outside the timed call, as bench_nsa.py does
    qh = x.q.transpose(1, 2)
    kh = x.k.repeat_interleave(g, dim=2).transpose(1, 2)
    vh = x.v.repeat_interleave(g, dim=2).transpose(1, 2)

    def fwd() -> object:
        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(qh, kh, vh, is_causal=True)

    grads = leaves(qh, kh, vh)
    d_out = x.dout.transpose(1, 2)

    def fwd_bwd() -> object:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(sdpa(*grads, is_causal=True), grads, d_out)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def load_impls(keys: list[str], windows: dict[int, SlidingWindow], cuda: bool) -> list[Impl]:
    """Every implementation asked for; a failed import becomes an Impl whose cells fail."""
    impls: list[Impl] = []
    ours = "compressed (l=32, d=16, mean) + selected (n=16 of l'=64) + window 512; fp32 gates"
    if "ours" in keys:
        impls.append(Impl("ours", "ours nsa_attention", ours, our_commit(), ours_fns))
    if "fla" in keys:
        sha = third_party_commit(FLA_DIR)
        try:
            mod = import_fla()
            win = "window 512 (flash-attn)" if mod.flash_attn_func else "no window (no flash-attn)"
            branches = f"compressed (l=d=64, mean) + selected (n=16 of 64); {win}; gates in q.dtype"
            impls.append(Impl("fla", "fla parallel_nsa", branches, sha, fla_fns(mod)))
        except Exception as exc:  # any import failure is reported, not fatal
            err = _report("fla import", exc)
            impls.append(Impl("fla", "fla parallel_nsa", "—", sha, _failed, err))
    if "xunhao" in keys:
        sha = third_party_commit(XUNHAO_DIR)
        win = "flash-attn" if flash_attn_window() else "FlexAttention" if cuda else "masked SDPA"
        branches = (
            "compressed (avgpool l=32, d=16) + selected (n=16 of 64) + window 512 "
            f"({win}); gates in q.dtype, combined in torch"
        )
        try:
            ops = import_xunhao()
            impls.append(Impl("xunhao", "XunhaoLai", branches, sha, xunhao_fns(ops, windows)))
        except Exception as exc:
            err = _report("XunhaoLai import", exc)
            impls.append(Impl("xunhao", "XunhaoLai", branches, sha, _failed, err))
        impls.append(
            Impl(
                "window",
                f"  its window alone ({win})",
                "sliding window 512 only (part of the XunhaoLai row)",
                f"torch {torch.__version__}",
                window_fns(windows),
            )
        )
    if "dense" in keys:
        impls.append(
            Impl(
                "dense",
                "dense causal SDPA cuDNN",
                "all T keys (GQA expanded)",
                f"torch {torch.__version__}",
                dense_fns,
            )
        )
    return impls


def _failed(x: Inputs) -> dict[str, Fn]:
    raise RuntimeError("not imported")


def _report(what: str, exc: BaseException) -> str:
    print(f"  {what}: FAILED {type(exc).__name__}: {exc}")
    traceback.print_exc(limit=-8)  # the innermost frames: where their code broke
    return f"{type(exc).__name__}: {exc}"


# ---- the run ---------------------------------------------------------------------------------

MODES = ("fwd", "fwd+bwd")


def run(args: argparse.Namespace) -> None:
    cuda = args.device.startswith("cuda")
    if not device_ready(args.device, "bench_nsa_others"):
        return
    windows: dict[int, SlidingWindow] = {}
    if not cuda:
        cpu_interpreter_shims()
    impls = load_impls(args.impls, windows, cuda)
    print(f"commit ours {our_commit()} ({our_variants()})")
    for impl in impls:
        if impl.key != "ours":
            print(f"commit {impl.label.strip()}: {impl.commit}")
    modes = MODES if args.backward else MODES[:1]
    timer = Timer(cuda, args.warmup, args.rep)
    seqs = sorted(args.seqs)
    ms: dict[tuple[str, str, int], float | None] = {}
    checks: list[str] = []

    for t in seqs:
        x = make_inputs(1, t, args.hq, args.hkv, args.dim, args.device, DTYPES[args.dtype])
        ref: dict[str, torch.Tensor] = {}  # ours' outputs at the smallest T, for the checks
        for impl in impls:
            try:
                fns = impl.build(x) if impl.error is None else {}
            except Exception as exc:  # one failure must not stop the others
                impl_err = _report(f"T={t} {impl.label} set-up", exc)
                fns = {}
                if impl.error is None and t == seqs[0]:
                    checks.append(f"{impl.label}: set-up FAILED {impl_err}")
            for mode in modes:
                key = (impl.key, mode, t)
                fn = fns.get(mode)
                if fn is None:
                    ms[key] = None
                    print(f"  T={t:6d} {impl.label:34s} {mode:8s} FAILED")
                    continue
                try:
                    ms[key] = timer(fn)
                    print(f"  T={t:6d} {impl.label:34s} {mode:8s} {ms[key]:9.3f} ms")
                except Exception as exc:
                    _report(f"T={t} {impl.label} {mode}", exc)
                    ms[key] = None
                    print(f"  T={t:6d} {impl.label:34s} {mode:8s} FAILED")
            if t == seqs[0] and "out" in fns:
                checks.extend(agreement(impl, fns, x, ref))
            del fns
            if cuda:
                torch.cuda.empty_cache()  # the next implementation gets the memory back
        del x, ref
        windows.pop(t, None)

    print(f"\n## agreement with ours at T={seqs[0]} (informational; the branches differ)")
    for line in checks:
        print(f"- {line}")
    for impl in impls:
        if impl.error:
            print(f"- {impl.label}: import FAILED: {impl.error}")
    print_table(impls, seqs, modes, ms, args, cuda)


def agreement(impl: Impl, fns: dict[str, Fn], x: Inputs, ref: dict[str, torch.Tensor]) -> list[str]:
    """Output against ours; fla also against ours at fla's settings; XunhaoLai's block sets."""
    lines: list[str] = []
    try:
        out = fns["out"]()
        assert isinstance(out, torch.Tensor)
        out = out.detach().reshape(x.q.shape)
        if impl.key == "ours":
            ref["paper"] = out
            return []
        if "paper" not in ref:
            ref["paper"] = ours_fns(x)["out"]()  # type: ignore[assignment]
        lines.append(f"{impl.label} vs ours: {diff(out, ref['paper'])}")
        if impl.key == "fla":
            # ours with fla's compression (mean over 64, stride 64) and its window when it has none
            cfg = NSAConfig(cmp_block=x.cfg.sel_block, cmp_stride=x.cfg.sel_block)
            gates = x.gates.clone()
            if "no window" in impl.branches:
                gates[..., 2] = 0
            with torch.no_grad():
                same = nsa_attention(x.q, x.k, x.v, gates, cfg)
            assert isinstance(same, torch.Tensor)
            lines.append(
                f"{impl.label} vs ours at fla's settings (cmp 64/64"
                + (", window gate 0" if "no window" in impl.branches else "")
                + f"): {diff(out, same)}"
            )
        if "blocks" in fns:
            lines.append(f"{impl.label} selected block sets equal to ours: {block_match(fns, x)}")
    except Exception as exc:
        lines.append(f"{impl.label}: check FAILED {_report(impl.label + ' check', exc)}")
    return lines


def block_match(fns: dict[str, Fn], x: Inputs) -> str:
    """Share of (token, KV head) rows whose selected block set equals ours (−1 = padding)."""
    theirs = fns["blocks"]()
    assert isinstance(theirs, torch.Tensor)
    with torch.no_grad():
        _, aux = nsa_attention(x.q, x.k, x.v, x.gates, x.cfg, return_aux=True)  # type: ignore[misc]
    mine = aux.block_indices[0].transpose(0, 1)  # [Hkv, T, n] like theirs

    def canon(idx: torch.Tensor) -> torch.Tensor:
        # sets compared as sorted lists, padding (any negative) moved last
        big = torch.iinfo(torch.int32).max
        idx = idx.to(torch.int32)
        return torch.where(idx < 0, big, idx).sort(-1).values

    n = max(mine.shape[-1], theirs.shape[-1])
    a, b = (
        torch.nn.functional.pad(canon(i), (0, n - i.shape[-1]), value=-1) for i in (mine, theirs)
    )
    a, b = canon(a), canon(b)
    rows = (a == b).all(-1)
    return f"{float(rows.float().mean()) * 100:.3f} % of {rows.numel()} rows"


def print_table(
    impls: list[Impl],
    seqs: list[int],
    modes: tuple[str, ...],
    ms: dict[tuple[str, str, int], float | None],
    args: argparse.Namespace,
    cuda: bool,
) -> None:
    timing = "CUDA-event medians" if cuda else "one wall-clock call each (interpreter)"
    print(
        f"\n## NSA side by side, B=1 Hq={args.hq} Hkv={args.hkv} D={args.dim} {args.dtype}, paper "
        f"config; ms ({timing}); ours {our_commit()} ({our_variants()})"
    )

    def tk(t: int) -> str:
        return f"{t // 1024}k" if t % 1024 == 0 else str(t)

    head = ["implementation", "mode", *(f"T={tk(t)}" for t in seqs)]
    head += [f"÷ ours T={tk(t)}" for t in seqs] + ["computes", "commit"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for impl in impls:
        for mode in modes:
            cells = [impl.label.strip(), mode]
            for t in seqs:
                v = ms.get((impl.key, mode, t))
                cells.append("FAILED" if v is None else f"{v:.2f}")
            for t in seqs:
                v, o = ms.get((impl.key, mode, t)), ms.get(("ours", mode, t))
                # the window row is a part of the XunhaoLai row, not an implementation of NSA
                mine = impl.key in ("ours", "window")
                cells.append("—" if mine or not v or not o else f"{v / o:.2f}")
            cells += [impl.branches, impl.commit]
            print("| " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[16384, 32768, 65536])
    ap.add_argument("--backward", action="store_true", help="also time fwd+bwd")
    ap.add_argument(
        "--impls",
        nargs="+",
        default=["ours", "fla", "xunhao", "dense"],
        choices=["ours", "fla", "xunhao", "dense"],
        help="implementations to time (xunhao adds its window-alone row)",
    )
    ap.add_argument("--device", default="cuda", help="cpu needs TRITON_INTERPRET=1")
    ap.add_argument("--hq", type=int, default=64, help="query heads")
    ap.add_argument("--hkv", type=int, default=4, help="KV heads (fla: Hq/Hkv a power of 2 ≥ 16)")
    ap.add_argument("--dim", type=int, default=128, help="head dim")
    ap.add_argument(
        "--dtype",
        default="bf16",
        choices=list(DTYPES),
        help="fp16: for the CPU smoke test (Triton 3.6's interpreter mis-loads bf16 through "
        "XunhaoLai's block pointers)",
    )
    # do_bench repeats for rep ms: 1000 keeps >= 4 samples in the median of a 200 ms fwd+bwd
    ap.add_argument("--warmup", type=int, default=100, help="do_bench warm-up (ms)")
    ap.add_argument("--rep", type=int, default=1000, help="do_bench repetitions (ms)")
    ap.add_argument("--tune-max", type=int, default=2, help="--backward: our configs tuned/kernel")
    args = ap.parse_args()
    print("command: PYTHONUNBUFFERED=1 python3 " + " ".join(sys.argv))
    run(args)


if __name__ == "__main__":
    main()
