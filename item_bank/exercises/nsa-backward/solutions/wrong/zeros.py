# expect: WRONG_ANSWER
import torch


def nsa_backward(q, k, v, gates, dout, config, block_indices):
    return tuple(torch.zeros_like(x) for x in (q, k, v, gates))
