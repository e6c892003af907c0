# expect: TIMEOUT
import torch
import torch.distributed as dist


def ring_attention_local(q, k, v, *, causal, group, layout="zigzag", scale=None):
    # every rank waits to receive first: a deadlock (the phase timeout must kill all ranks)
    buf = torch.empty_like(k)
    dist.recv(buf, src=(dist.get_rank(group) - 1) % dist.get_world_size(group), group=group)
    return q.clone(), torch.zeros(q.shape[0], q.shape[2], q.shape[1], device=q.device)
