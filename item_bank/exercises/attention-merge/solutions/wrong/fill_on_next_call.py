# expect: WRONG_ANSWER
# needs: benchmark
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): each timed call returns unfinished outputs and finishes the
# previous call's during its own, so every call's time is about one call's work and every
# output is complete by the time the old harness read it. Caught: the outputs are captured inside
# each call's window, where they are still unfinished.
# include: ../correct/stable_fp32.py
# include: ../../../cheat_helpers.py

merge_attention = _fill_on_next_call(merge_attention)
