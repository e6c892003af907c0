# expect: WRONG_ANSWER
# ruff: noqa: F821 (names from the included file)
# Known-wrong: the gates' gradient is missing (the gates treated as constants: zeros returned),
# dq, dk, dv right.
# include: ../correct/dense_autograd.py

_honest = nsa_backward


def nsa_backward(q, k, v, gates, dout, config, block_indices):
    dq, dk, dv, _ = _honest(q, k, v, gates, dout, config, block_indices)
    return dq, dk, dv, torch.zeros_like(gates)
