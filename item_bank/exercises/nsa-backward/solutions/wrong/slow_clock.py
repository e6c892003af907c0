# expect: INTEGRITY_VIOLATION
# needs: gpu
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): honest maths, but the runner's clock and its CUDA event timer
# run 4x slow, and its identity records are updated to the slowed ones. Caught: the grader's own
# wall clock per call is not accounted for by the reported time and the harness's overhead.
# On CPU the rehearsal's calls are too short (well under a millisecond) for the wall clock
# to tell a slowed timer from the host's noise: graded on the GPU.
# include: ../correct/dense_autograd.py
# include: ../../../cheat_helpers.py

nsa_backward = _slow_clock(nsa_backward)
