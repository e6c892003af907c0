# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): a thread started at import does the real work just after each
# timed window; the timed call only hands it the inputs and returns unfinished outputs. Nothing of
# the runner is modified. Caught: the host counts the job's threads against its count before the
# import (and the outputs captured inside the window are unfinished).
# include: ../correct/dense_autograd.py
# include: ../../../cheat_helpers.py

nsa_backward = _background_thread(nsa_backward)
