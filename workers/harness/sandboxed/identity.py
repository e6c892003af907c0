"""The runner's identity records ("tamper" checks): what the runner is made of, recorded when it
starts (before any student code exists) and compared after every call. A submission that
replaces one of them (a clock, an event method, a ``Rank`` method, a helper function of any
runner module) is reported, and the parent turns any report into INTEGRITY_VIOLATION.

This only raises the bar: the records live in the process the submission controls (the bank's
cheats update them), so the parent's own clock and the output digests committed at the end of
each window are what a forger must beat. Covered:

- the clocks, events and torch functions a timed call reads (``torch.cuda.synchronize``, ...);
- every method of ``Rank``, as its instances resolve it through the parts it is made of, and no
  method shadowed on the instance;
- every function, class and module named by the runner's modules' globals, under
  ``<module>.<name>`` (``runner._perf``, ``captures.output_digest``, ...), and no new name there
  (a global that shadows a builtin the harness calls).
"""

from __future__ import annotations

import time
import types
from typing import Any

# bound before any student code exists (a replaced builtin cannot reach them)
_type = type
_callable = callable
_vars = vars


def resolve(cls: type, name: str) -> Any:
    """``name`` as an instance of ``cls`` finds it: in the first class of its MRO that has it."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


def methods(cls: type) -> tuple[str, ...]:
    """Every method ``cls`` has, its parts' included (not ``__init__``, not ``object``'s)."""
    names: list[str] = []
    for klass in cls.__mro__[:-1]:
        for k, v in klass.__dict__.items():
            if _callable(v) and k != "__init__" and k not in names:
                names.append(k)
    return tuple(names)


def _covered(name: str, v: Any) -> bool:
    return not name.startswith("__") and (_callable(v) or _type(v) is types.ModuleType)


class Records:
    """Where each record is looked up, fixed when the runner starts, so the check after every
    call is a pass of dictionary lookups (it runs in every timed call's reply, on the parent's
    clock): the names of each module's globals, ``Rank``'s methods, and the clocks and events.

    ``cls``: the runner's class; ``watched``: its methods; ``modules``: the runner's modules by
    short name."""

    def __init__(
        self,
        torch: Any,
        device: str,
        cls: type,
        watched: tuple[str, ...],
        modules: dict[str, types.ModuleType],
    ) -> None:
        self.torch, self.device, self.cls, self.watched = torch, device, cls, watched
        # the class dictionaries a method is looked up in, in MRO order (live views; the MRO
        # itself is compared too: reassigned bases would change every resolution)
        self.mro = cls.__mro__
        self.mro_dicts = [k.__dict__ for k in self.mro]
        self.slots: dict[str, tuple[dict[str, Any], str]] = {}
        self.namespaces: list[tuple[str, dict[str, Any], int, frozenset[str]]] = []
        for short, mod in modules.items():
            ns = _vars(mod)
            self.namespaces.append((short, ns, len(ns), frozenset(ns)))
            for k, v in ns.items():
                if _covered(k, v):
                    self.slots[f"{short}.{k}"] = (ns, k)

    def fixed(self) -> dict[str, Any]:
        """The clocks, events and torch functions a timed call reads, as they are now."""
        torch = self.torch
        now: dict[str, Any] = {
            "time.perf_counter": time.perf_counter,
            "torch.empty": torch.empty,
            "Tensor.copy_": torch.Tensor.copy_,
        }
        if self.device == "cuda":
            E = torch.cuda.Event
            now.update(
                {
                    "torch.cuda.Event": E,
                    "Event.record": getattr(E, "record", None),
                    "Event.elapsed_time": getattr(E, "elapsed_time", None),
                    "Event.synchronize": getattr(E, "synchronize", None),
                    "torch.cuda.synchronize": torch.cuda.synchronize,
                }
            )
        return now

    def current(self) -> dict[str, Any]:
        """Every record as it is now: what the runner records when it starts."""
        now = self.fixed()
        now.update({k: ns.get(name) for k, (ns, name) in self.slots.items()})
        now.update({f"Rank.{m}": resolve(self.cls, m) for m in self.watched})
        return now

    def check(self, ids: dict[str, Any], obj: Any, bound: dict[str, Any]) -> list[str]:
        """The names whose object is not the one in ``ids`` (empty: nothing replaced).
        ``obj``: the runner instance, of exactly the runner's class; ``bound``: its own
        attributes recorded at start."""
        fixed = self.fixed()
        cls = _type(obj)
        slots, mro_dicts = self.slots, self.mro_dicts
        bad = []
        for k, v in ids.items():
            slot = slots.get(k)
            if slot is not None:
                cur = slot[0].get(slot[1])
            elif k.startswith("Rank."):
                m = k[5:]
                cur = next((d[m] for d in mro_dicts if m in d), None)
            else:
                cur = fixed.get(k)
            if cur is not v:
                bad.append(k)
        if self.cls.__mro__ != self.mro:
            bad.append("runner class bases")
        for short, ns, n, names in self.namespaces:
            if len(ns) != n or ns.keys() != names:  # a name added (a global shadowing a builtin)
                # not dunders: the warnings machinery adds __warningregistry__ to a module a
                # warning is attributed to, honestly
                bad += sorted(f"{short}.{k}" for k in ns.keys() - names if not k.startswith("__"))
        if cls is not self.cls:
            bad.append("runner class")
        bad += [f"Rank.{m} (instance)" for m in self.watched if m in _vars(obj)]
        bad += [f"self.{k}" for k, v in bound.items() if getattr(obj, k, None) is not v]
        torch = self.torch
        if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
            bad.append("torch mode stack not empty")
        return bad
