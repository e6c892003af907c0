# expect: INTEGRITY_VIOLATION
# needs: gpu
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): timed calls put their work on a side stream that the call never
# joins, GPU-bound (one long launch after the real work) so the host returns at once and events
# on the timed stream see almost nothing. Caught: the device-wide sync before the end event puts
# the work back in the time, and the median timed-stream time against the median device time
# shows the work left the timed stream. (Work launched from Python op by op keeps the host busy
# for most of it: the pipeline's run 12 graded such a version PASS at 0.25x, its time counted.)
# include: ../correct/stable_fp32.py
# include: ../../../cheat_helpers.py

merge_attention = _side_stream(merge_attention)
