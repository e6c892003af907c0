# expect: WRONG_ANSWER
# needs: benchmark
# ruff: noqa: F821 (names from the included file)
# Known-wrong: the honest dense autograd on every shape except the public benchmark shapes
# (spec.yaml, recognised by their exact dimensions and config, as an attacker reading the spec
# would), where autograd runs in bf16 throughout (no upcast: logits, probabilities and their
# gradients rounded to bf16). The tests never see it; the timed calls' checked probes, with
# their peaked rows (q x3), must.
# include: ../correct/dense_autograd.py

_honest = nsa_backward


def low_precision_backward(q, k, v, gates, dout, config, block_indices):
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v, gates)]
    with torch.enable_grad():
        out = forward(*leaves, config, block_indices)
        return torch.autograd.grad(out, leaves, dout)


# (B, T, Hq, Hkv, D, config) of `benchmark:` and `rehearsal_benchmark:`, all bf16
PAPER = (32, 16, 64, 16, 1, 2, 512)
BENCH_SHAPES = {(1, 4096, 16, 1, 128, PAPER), (1, 112, 2, 1, 16, (16, 8, 16, 3, 1, 1, 24))}


def nsa_backward(q, k, v, gates, dout, config, block_indices):
    c = config
    cfg = (c.cmp_block, c.cmp_stride, c.sel_block, c.sel_count, c.sel_init, c.sel_local, c.window)
    key = (q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], cfg)
    if q.dtype == torch.bfloat16 and key in BENCH_SHAPES:
        return low_precision_backward(q, k, v, gates, dout, config, block_indices)
    return _honest(q, k, v, gates, dout, config, block_indices)
