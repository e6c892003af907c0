# expect: INTEGRITY_VIOLATION
# needs: gpu
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): right after each timed window the runner is made to launch
# ~100 ms of GPU work that nobody waits for, so it runs while our reference is timed beside the
# submission and slows it; the runner's identity records are updated to hide the replaced method.
# Caught: our reference's runner finds the GPU busy before its turn, which is charged to the
# submission.
# include: ../correct/dense_autograd.py
# include: ../../../cheat_helpers.py

nsa_backward = _gpu_in_flight(nsa_backward)
