# expect: RUNTIME_ERROR
def merge_attention(out_a, lse_a, out_b, lse_b):
    raise RuntimeError("not implemented yet")
