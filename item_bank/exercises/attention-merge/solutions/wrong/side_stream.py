# expect: WRONG_ANSWER
# needs: gpu
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): timed calls put their work on a side stream that the call never
# joins, GPU-bound (one long launch after the real work) so the host returns at once and events
# on the timed stream see almost nothing. Caught first by the capture: the harness copies the
# outputs on the timed stream as soon as the call returns, before the side stream has written
# them, so the checked calls see the allocator's NaN poison (run 13 on the H200: "out: 98016
# NaN/Inf values", WRONG_ANSWER). Behind it: the device-wide sync before the end event puts the
# work back in the time, and the median timed-stream time against the median device time flags
# work that left the timed stream (INTEGRITY_VIOLATION). (Work launched from Python op by op
# keeps the host busy for most of it: run 12 graded such a version PASS at 0.25x, its time
# counted in full.)
# include: ../correct/stable_fp32.py
# include: ../../../cheat_helpers.py

merge_attention = _side_stream(merge_attention)
