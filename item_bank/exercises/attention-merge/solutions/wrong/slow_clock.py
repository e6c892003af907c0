# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): honest maths, but the runner's clock and its CUDA event timer
# run 4x slow, and its identity records are updated to the slowed ones. Caught: the grader's own
# wall clock per call is not accounted for by the reported time and the harness's overhead.
# include: ../correct/stable_fp32.py
# include: ../../../cheat_helpers.py

merge_attention = _slow_clock(merge_attention)
