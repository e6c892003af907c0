# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): timed calls return outputs at once, unfinished; a replaced runner
# method finishes them only when the grader asks for the outputs it checks, outside any timed
# window, and the runner's identity records are updated so its own check sees nothing. Caught:
# the outputs captured inside the window do not match the digest committed at its end.
# include: ../correct/dense_autograd.py
# include: ../../../cheat_helpers.py

nsa_backward = _lazy_outputs(nsa_backward)
