# expect: WRONG_ANSWER
# ruff: noqa: F821 (names from the included file)
# Known-wrong (GQA): a KV head's dk, dv taken from the first query head of its group only
# (times G, "they share the head"), instead of the sum over the G query heads that use it.
# include: ../correct/manual_grads.py


def _group_sum(x, G):
    return x.unflatten(1, (-1, G))[:, :, 0] * G
