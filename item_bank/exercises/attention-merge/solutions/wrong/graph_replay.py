# expect: WRONG_ANSWER
# needs: gpu
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): the first timed call of a shape records a CUDA graph of the
# honest work on that call's inputs; later calls replay it and return its static outputs. Caught:
# every call has new input values (and addresses), so a replay computes an old call's answer.
# include: ../correct/stable_fp32.py
# include: ../../../cheat_helpers.py

merge_attention = _graph_replay(merge_attention)
