# expect: INTEGRITY_VIOLATION
# needs: benchmark
# ruff: noqa: F821 (names from the included files)
# Known-wrong (timing cheat): timed calls return outputs at once, unfinished; a replaced runner
# method finishes them only when the grader asks for the outputs it checks, outside any timed
# window, and the runner's identity records are updated so its own check sees nothing. Caught:
# the outputs captured inside the window do not match the digest committed at its end.
# include: ../correct/masked_torch.py
# include: ../../../cheat_helpers.py

import torch as _torch

_honest = nsa_attention
_tmpl: dict = {}
_R = _main.Rank
_write = _R.write_captures


def _write_captures(self, p):
    if p.msg.get("timed") and p.src is None:
        self.capture(_honest(*p.args, **p.kwargs), p)  # the real work, after the window
    return _write(self, p)


_R.write_captures = _write_captures
_rank().ids["Rank.write_captures"] = _write_captures


def nsa_attention(*args, **kwargs):
    if not _timed_now(_rank()):
        return _honest(*args, **kwargs)
    key = tuple(tuple(a.shape) for a in args if isinstance(a, _torch.Tensor))
    if key not in _tmpl:  # the first timed call of a shape is real: it is always checked
        _tmpl[key] = _honest(*args, **kwargs)
        return _tmpl[key]
    return _unfinished(_tmpl[key])
