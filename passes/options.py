"""How to plan: ``PlanOptions``, the one spelling of every planning option.

``graphc.parallelize`` builds it from its keyword arguments, ``graphc compile`` / ``graphc run``
from their flags (the same names: ``--memory`` sets ``memory_limit``, ``--no-shrink`` ``shrink``),
and every planner reads it: the sharding problem (passes/partition.py ``build_problem``), the
pipeline planner (passes/pipeline.py), the mesh search (passes/search.py). The plan cache key and
the plan files hold ``to_json()``; ``from_json`` reads it back, checked.

Each option has one type and one set of values, defined here next to it:

    option           type                          values
    memory_limit     bytes per device (int)        None: no limit ("2GiB" strings are parsed by
                                                   graphc/core/units.py where users write them)
    time_limit       seconds (float)               > 0: the whole compile's wall time
    zero             "auto" | 0 | 1 | 2 | 3        ZERO_CHOICES: ZeRO along the data axes
                                                   (passes/sharding/zero.py); "auto" the solver picks
    recompute        "auto" | "on" | "off"         RECOMPUTE_MODES: activation recomputation
                                                   (passes/recompute/choices.py)
    microbatches     int >= 1                      a pipeline's micro-batches (meshes with a pp axis)
    schedule         "1f1b" | "gpipe"              SCHEDULES: a pipeline's schedule
    shrink           bool                          tie repeated layers, merge followers (ilp.py)
    free_axes        bool                          ignore the axis roles (passes/sharding/roles.py)
    solver           "highs" | "cpsat" | ...       SOLVERS: the ILP backend (passes/sharding/milp.py)
    linear_partials  bool                          carry partial sums through ops linear in them
    bucket_bytes     int >= 0                      gradient buckets (passes/bucket.py); 0: none

Old spellings are accepted with a ``DeprecationWarning`` naming the new one: ``recompute=True`` /
``False`` / ``None`` ("on" / "off" / "auto") and ``zero=None`` ("auto"). Old plan files load:
their ``time_limit_s`` is ``time_limit``, their old values are mapped the same way (without a
warning: the file is not the user's code), and an option a file lacks takes the value the
planner had before the option existed (``BEFORE_OPTION``).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from graphc.core.errors import PlanError, user_stacklevel
from graphc.passes.bucket import DEFAULT_BUCKET_BYTES

RECOMPUTE_MODES = ("auto", "on", "off")
ZERO_STAGES = (0, 1, 2, 3)
ZERO_CHOICES = ("auto", *ZERO_STAGES)
SCHEDULES = ("1f1b", "gpipe")
SOLVERS = ("highs", "cpsat", "CBC", "SCIP")

Recompute = Literal["auto", "on", "off"]
Zero = Literal["auto", 0, 1, 2, 3]
Schedule = Literal["1f1b", "gpipe"]
Solver = Literal["highs", "cpsat", "CBC", "SCIP"]

# What a plan file written before an option existed was planned with: no gradient buckets, no
# ZeRO, no recomputation, the axis roles, one micro-batch.
BEFORE_OPTION: dict[str, Any] = {
    "bucket_bytes": 0,
    "zero": 0,
    "recompute": "off",
    "free_axes": False,
    "microbatches": 1,
    "schedule": "1f1b",
}
RENAMED = {"time_limit_s": "time_limit"}  # old plan files' keys


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How to plan (the module doc lists every option, its type and its values). Frozen; a bad
    value is a ``PlanError`` naming the option, raised where the object is made."""

    memory_limit: int | None = None
    time_limit: float = 60.0
    zero: Zero = "auto"
    recompute: Recompute = "auto"
    microbatches: int = 1
    schedule: Schedule = "1f1b"
    shrink: bool = True
    free_axes: bool = False
    solver: Solver = "highs"
    linear_partials: bool = True
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _CHECKS[f.name](getattr(self, f.name)))

    @classmethod
    def of(cls, **options: Any) -> PlanOptions:
        """The options as users write them (``graphc.parallelize``'s keywords): an old spelling
        is accepted with a DeprecationWarning naming the new one (``new_spelling``)."""
        return cls(**{name: new_spelling(name, value) for name, value in options.items()})

    @property
    def forced_zero(self) -> int | None:
        """The ZeRO stage every parameter group is forced to (1-3), or None (off or the solver's)."""
        return None if self.zero in ("auto", 0) else int(self.zero)

    def to_json(self) -> dict[str, Any]:
        """Every option by name: JSON numbers, strings, booleans and null."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, doc: Any, source: str = "<options>") -> PlanOptions:
        """The options ``to_json`` wrote, or an older plan file's (module doc); ``PlanError``
        naming ``source`` and the option for an unknown key or a bad value."""
        if not isinstance(doc, dict):
            raise PlanError(f"{source}: options must be a JSON object {{option: value}}, got {doc!r}")
        names = [f.name for f in dataclasses.fields(cls)]
        values: dict[str, Any] = {}
        for key, value in doc.items():
            name = RENAMED.get(key, key)
            if name not in names:
                raise PlanError(f"{source}: options has an unknown option {key!r} (options: {', '.join(names)})")
            values[name] = new_spelling(name, value, warn=False)
        for name in names:
            if name not in values and name in BEFORE_OPTION:
                values[name] = BEFORE_OPTION[name]
        try:
            return cls(**values)
        except PlanError as exc:
            raise PlanError(f"{source}: options.{exc}") from None


# --- the values of each option -----------------------------------------------------------------------


def new_spelling(name: str, value: Any, warn: bool = True) -> Any:
    """``value`` of option ``name`` in its current spelling: ``recompute=True`` / ``False`` /
    ``None`` is "on" / "off" / "auto", ``zero=None`` is "auto"; any other value as it is. With
    ``warn``, a DeprecationWarning at the user's line names the new spelling (an old plan file's
    values are mapped silently)."""
    if name == "recompute" and (value is None or isinstance(value, bool)):
        new = {True: "on", False: "off", None: "auto"}[value]
    elif name == "zero" and value is None:
        new = "auto"
    else:
        return value
    if warn:
        warnings.warn(
            f"{name}={value!r} is deprecated: write {name}={new!r}", DeprecationWarning, stacklevel=user_stacklevel()
        )
    return new


def check_zero(value: Any) -> Zero:
    """``zero`` as an option: "auto" or a ZeRO stage 0-3; PlanError otherwise."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value in ZERO_STAGES):
        return value
    raise PlanError(
        f"zero must be one of 'auto', 0, 1, 2, 3 (a ZeRO stage; 'auto': the solver picks each parameter's), "
        f"got {value!r}"
    )


def zero_from_text(text: str) -> Any:
    """A ``--zero`` flag's text as the option's value: a stage written as digits is an int (the
    parser then checks it against ``ZERO_CHOICES``)."""
    return int(text) if text.isdigit() else text


def check_recompute(value: Any) -> Recompute:
    """``recompute`` as an option: "auto", "on" or "off"; PlanError otherwise."""
    if isinstance(value, str) and value in RECOMPUTE_MODES:
        return value  # type: ignore[return-value]
    raise PlanError(f"recompute must be one of 'auto', 'on', 'off', got {value!r}")


def _check_memory_limit(value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise PlanError(f"memory_limit must be a positive number of bytes or None, got {value!r}")


def _check_time_limit(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value):
        return float(value)
    raise PlanError(f"time_limit must be a positive number of seconds, got {value!r}")


def _check_microbatches(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise PlanError(f"microbatches must be a positive int, got {value!r}")


def _one_of(name: str, choices: tuple) -> Any:
    def check(value: Any) -> Any:
        if isinstance(value, str) and value in choices:
            return value
        raise PlanError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")

    return check


def _flag(name: str) -> Any:
    def check(value: Any) -> bool:
        if isinstance(value, bool):
            return value
        raise PlanError(f"{name} must be True or False, got {value!r}")

    return check


def _check_bucket_bytes(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise PlanError(f"bucket_bytes must be a number of bytes >= 0 (0: no buckets), got {value!r}")


_CHECKS = {
    "memory_limit": _check_memory_limit,
    "time_limit": _check_time_limit,
    "zero": check_zero,
    "recompute": check_recompute,
    "microbatches": _check_microbatches,
    "schedule": _one_of("schedule", SCHEDULES),
    "shrink": _flag("shrink"),
    "free_axes": _flag("free_axes"),
    "solver": _one_of("solver", SOLVERS),
    "linear_partials": _flag("linear_partials"),
    "bucket_bytes": _check_bucket_bytes,
}


__all__ = [
    "BEFORE_OPTION",
    "RECOMPUTE_MODES",
    "SCHEDULES",
    "SOLVERS",
    "ZERO_CHOICES",
    "ZERO_STAGES",
    "PlanOptions",
    "Recompute",
    "Schedule",
    "Solver",
    "Zero",
    "check_recompute",
    "check_zero",
    "new_spelling",
    "zero_from_text",
]
