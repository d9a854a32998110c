"""A fast constructor for the frozen, slotted dataclasses built by the million (trace
events, idle gaps)."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

__all__ = ["fast_maker"]


def fast_maker(cls: type) -> Any:
    """Return a function that builds `cls(*values)` (every field, positionally) for a frozen
    slotted dataclass without its generated __init__, or `cls` itself if the class does more
    than store its fields (a __post_init__, a field that is not a slot or not an init field).

    A frozen __init__ stores each field through object.__setattr__, a Python-level call per
    field. The function here fills an instance of a plain class with the same slots, whose
    attribute stores Python does at C speed, then makes it a `cls` by assigning __class__
    (allowed between classes of identical layout): the same object, several times faster
    (benchmarks/RESULTS.md, "Measurements behind design choices", M2), and the loader
    builds millions of them (tests/io/test_trace_fast.py checks the objects are equal).
    Where the layouts differ, the slot descriptors are called directly instead."""
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    if (
        hasattr(cls, "__post_init__")
        or not all(f.init for f in fields)
        or not all(isinstance(cls.__dict__.get(n), types.MemberDescriptorType) for n in names)
    ):
        return cls
    shell = type(f"_{cls.__name__}Shell", (), {"__slots__": cls.__dict__["__slots__"]})
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_shell": shell}
    head = f"def make_{cls.__name__}({', '.join(names)}):\n"
    # The names are the class's own field names.
    exec(
        head
        + "    obj = _new(_shell)\n"
        + "".join(f"    obj.{name} = {name}\n" for name in names)
        + "    obj.__class__ = _cls\n    return obj\n",
        scope,
    )
    make = scope[f"make_{cls.__name__}"]
    try:
        probe = make(*names)
    except TypeError:  # "__class__ assignment: ... object layout differs"
        probe = None
    if type(probe) is cls and all(getattr(probe, n) == n for n in names):
        return make
    for i, name in enumerate(names):
        scope[f"_set{i}"] = cls.__dict__[name].__set__
    exec(
        head
        + "    obj = _new(_cls)\n"
        + "".join(f"    _set{i}(obj, {name})\n" for i, name in enumerate(names))
        + "    return obj\n",
        scope,
    )
    return scope[f"make_{cls.__name__}"]
