# expect: WRONG_ANSWER
# needs: benchmark
# Known-wrong: the fp32 merge on every shape except the public benchmark shapes (spec.yaml,
# recognised by their exact dimensions, as an attacker reading the spec would), where it takes
# the shortcut reported on the H200 (1.45x, PASS before): fp32 LSEs, but the weights, products
# and sum in the outputs' bf16. Only the timed calls can catch it: its largest error is within
# 2x the honest one, its RMS error 1.6x (the honest kernel rounds once, this one three times),
# which the merge's RMS bound (rms_k) refuses.
import torch
import torch.nn.functional as F

# (B, T, H, D) of `benchmark:` and `rehearsal_benchmark:`, all bf16
BENCH_SHAPES = {(1, 16384, 16, 128), (1, 65536, 4, 128), (1, 4096, 8, 64)}


def merge_exact(out_a, lse_a, out_b, lse_b):
    a_empty, b_empty = torch.isneginf(lse_a), torch.isneginf(lse_b)
    w = torch.sigmoid(torch.where(a_empty | b_empty, torch.zeros_like(lse_a), lse_b - lse_a))
    w = torch.where(b_empty, torch.zeros_like(w), torch.where(a_empty, torch.ones_like(w), w))
    w = w.transpose(1, 2).unsqueeze(-1)  # [B, T, H, 1]: weight of side b
    oa, ob = out_a.float(), out_b.float()
    lse = torch.where(
        b_empty, lse_a, torch.where(a_empty, lse_b, lse_a - F.logsigmoid(lse_a - lse_b))
    )
    return (oa - w * (oa - ob)).to(out_a.dtype), lse.float().contiguous()


def merge_low_precision(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    dt = out_a.dtype  # the shortcut: 16-bit weights, products and sum
    wa = torch.exp(lse_a - safe).to(dt).transpose(1, 2).unsqueeze(-1)  # [B, T, H, 1]
    wb = torch.exp(lse_b - safe).to(dt).transpose(1, 2).unsqueeze(-1)
    return (out_a * wa + out_b * wb).contiguous(), lse.contiguous()


def merge_attention(out_a, lse_a, out_b, lse_b):
    if out_a.dtype == torch.bfloat16 and tuple(out_a.shape) in BENCH_SHAPES:
        return merge_low_precision(out_a, lse_a, out_b, lse_b)
    return merge_exact(out_a, lse_a, out_b, lse_b)
