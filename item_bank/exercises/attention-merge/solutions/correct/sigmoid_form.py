import torch
import torch.nn.functional as F


def merge_attention(out_a, lse_a, out_b, lse_b):
    # out = out_a - sigmoid(lse_b - lse_a) * (out_a - out_b), with the -inf sides handled.
    a_empty = torch.isneginf(lse_a)
    b_empty = torch.isneginf(lse_b)
    d = torch.where(a_empty | b_empty, torch.zeros_like(lse_a), lse_b - lse_a)
    w = torch.sigmoid(d)
    w = torch.where(b_empty, torch.zeros_like(w), torch.where(a_empty, torch.ones_like(w), w))
    w = w.transpose(1, 2).unsqueeze(-1)
    oa, ob = out_a.float(), out_b.float()
    out = oa - w * (oa - ob)
    lse = torch.where(
        b_empty, lse_a, torch.where(a_empty, lse_b, lse_a - F.logsigmoid(lse_a - lse_b))
    )
    return out.to(out_a.dtype), lse.float().contiguous()
