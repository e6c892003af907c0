# expect: WRONG_ANSWER
# ruff: noqa: F821 (names from the included file)
# Known-wrong: the mean pooling's backward forgets the 1/l: every token of a compressed block
# receives the block's whole dk̃, dṽ (the pooling differentiated as a sum).
# include: ../correct/manual_grads.py


def _unpool(dxc, T, l, d):
    B, H, Tc, D = dxc.shape
    dx = dxc.new_zeros(B, H, T, D)
    for u in range(l):
        dx[:, :, u : u + (Tc - 1) * d + 1 : d] += dxc  # missing / l
    return dx
