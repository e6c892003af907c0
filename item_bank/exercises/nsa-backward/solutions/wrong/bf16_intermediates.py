# expect: WRONG_ANSWER
# ruff: noqa: F821 (names from the included file)
# Known-wrong (precision): autograd through the dense NSA in the input dtype, so with bf16
# inputs every intermediate (logits, probabilities, dP, dS, the branch and head sums) is
# rounded to bf16. Its largest errors stay near the honest ones; its RMS error is 2-6x the
# honest kernel's (worst with peaked logits), caught by the RMS bound.
# include: ../correct/dense_autograd.py


def _up(x):  # the shortcut: no upcast
    return x
