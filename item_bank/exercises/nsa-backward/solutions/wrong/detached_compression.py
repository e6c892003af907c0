# expect: WRONG_ANSWER
# ruff: noqa: F821 (names from the included file)
# Known-wrong: the compressed branch's keys and values are pooled without a gradient (k̃, ṽ
# detached): dq and the gates' gradient are right, dk and dv miss the compressed branch.
# include: ../correct/dense_autograd.py


def _pool(x, l, d):
    return (x.unfold(1, l, d).mean(-1) if x.shape[1] >= l else x[:, :0]).detach()
