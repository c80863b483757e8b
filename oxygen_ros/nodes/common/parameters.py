"""The nodes' ROS parameters: the machinery every node declares and validates them with.

Every parameter has a spec (type, default, description, whether it may change at run time and a
check that returns a reason). The tables live beside their nodes (`<node package>/params.py`;
the ones several nodes declare in `common/params.py`); `config/humanoid.yaml` and
`config/workcell.yaml` set them (a test checks that every YAML key is a declared parameter and
that every declared parameter is in the YAML).

Invariants:
- A value is accepted only if it converts to the spec's type and passes its check; otherwise
  the set is refused with a reason naming the parameter and the old value is kept. At start-up
  a bad value from YAML or the command line raises `ParameterError` (the node exits non-zero
  with that reason) instead of running with a half-valid configuration.
- Parameters whose spec is not `runtime` are read-only after start-up: changing them needs a
  restart (the engine's compiled shapes, topics and paths depend on them).
- Integers are accepted for float parameters (`ros2 param set ... action_rate_hz 50`), and an
  empty list given on the command line (which ROS turns into "not set") reads as [].
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Check = Callable[[Any], str | None]


class ParameterError(ValueError):
    """Invalid parameter values at start-up."""


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter."""

    name: str
    default: Any
    description: str
    kind: str  # "float", "int", "bool", "str", "float_list", "str_list"
    runtime: bool = False  # may be changed while the node runs
    check: Check | None = None  # returns a reason when the (converted) value is invalid


def coerce(kind: str, value: Any) -> Any:
    """Converts a parameter value to `kind`; raises ValueError with a reason."""
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        return int(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value
    if kind in ("float_list", "str_list"):
        if value is None:
            return []
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise ValueError(f"expected a list, got {value!r}")
        items = list(value)
        item_kind = "float" if kind == "float_list" else "str"
        return [coerce(item_kind, v) for v in items]
    raise ValueError(f"unknown parameter kind {kind!r}")


# ------------------------------------------------------------------------------------ checks
def _bounded(check: Check, lo: float, hi: float, constraint: str) -> Check:
    """Marks `check` with the closed range its values lie in (the parameter descriptor's
    `floating_point_range` / `integer_range`, which `ros2 param describe` and rqt show and
    rclpy enforces on every set) and a human-readable constraint."""
    check.bounds = (lo, hi)  # type: ignore[attr-defined]
    check.constraint = constraint  # type: ignore[attr-defined]
    return check


def positive_rate(max_hz: float = 1000.0) -> Check:
    def check(v: float) -> str | None:
        if not (math.isfinite(v) and 0 < v <= max_hz):
            return f"must be a rate in (0, {max_hz:g}] Hz"
        return None

    return _bounded(check, 0.0, max_hz, f"a rate in (0, {max_hz:g}] Hz")


def period_or_zero(min_s: float = 0.05) -> Check:
    def check(v: float) -> str | None:
        if not math.isfinite(v) or v < 0 or 0 < v < min_s:
            return f"must be 0 (disabled) or a period >= {min_s:g} s"
        return None

    return check


def positive(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else "must be > 0"


def non_negative(v: float) -> str | None:
    return None if math.isfinite(v) and v >= 0 else "must be >= 0"


def int_range(lo: int, hi: int) -> Check:
    def check(v: int) -> str | None:
        return None if lo <= v <= hi else f"must be in [{lo}, {hi}]"

    return _bounded(check, lo, hi, f"in [{lo}, {hi}]")


def float_range(lo: float, hi: float) -> Check:
    def check(v: float) -> str | None:
        return None if math.isfinite(v) and lo <= v <= hi else f"must be in [{lo:g}, {hi:g}]"

    return _bounded(check, lo, hi, f"in [{lo:g}, {hi:g}]")


def one_of(*choices: str) -> Check:
    def check(v: str) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    check.constraint = "one of: " + ", ".join(repr(c) for c in choices)  # type: ignore[attr-defined]
    return check


def non_empty(v: Sequence) -> str | None:
    return None if len(v) > 0 else "must not be empty"


def unique_names(v: Sequence[str]) -> str | None:
    if not v:
        return "must not be empty"
    return unique_names_or_none(v)


def unique_names_or_none(v: Sequence[str]) -> str | None:
    """Like `unique_names`, but an empty list is allowed."""
    if len(set(v)) != len(v) or any(not s for s in v):
        return "names must be unique and non-empty"
    return None


def topic_name(v: str) -> str | None:
    if not v or v.endswith("/") or " " in v:
        return "must be a valid topic name"
    return None


def optional_topic_name(v: str) -> str | None:
    """A topic name, or '' (off)."""
    return topic_name(v) if v else None


def prefixed(prefix: str, template: Sequence[ParamSpec]) -> tuple[ParamSpec, ...]:
    """`template` with every name under `prefix.`."""
    return tuple(dataclasses.replace(s, name=f"{prefix}.{s.name}") for s in template)


def camera_specs(camera: str, template: Sequence[ParamSpec]) -> tuple[ParamSpec, ...]:
    """The per-camera parameters `cameras.<camera>.<field>`."""
    return prefixed(f"cameras.{camera}", template)


def validate(spec: ParamSpec, value: Any) -> tuple[Any, str | None]:
    """Returns (converted value, None) or (None, reason)."""
    try:
        converted = coerce(spec.kind, value)
    except ValueError as exc:
        return None, f"{spec.name}: {exc}"
    if spec.check is not None:
        reason = spec.check(converted)
        if reason:
            return None, f"{spec.name}={converted!r} refused: {reason}"
    return converted, None


def descriptor(spec: ParamSpec, with_range: bool = True) -> Any:
    """The `ParameterDescriptor` of `spec`: description, read-only unless runtime, dynamic
    typing (integers are accepted for floats), the check's constraint as text and, for a
    bounded check, its closed range (a float range for floats, an integer range for ints)."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    out = ParameterDescriptor(
        description=spec.description + ("" if spec.runtime else " (restart to change)"),
        read_only=not spec.runtime,
        dynamic_typing=True,
        additional_constraints=getattr(spec.check, "constraint", ""),
    )
    bounds = getattr(spec.check, "bounds", None)
    if with_range and bounds is not None:
        lo, hi = bounds
        if spec.kind == "float":
            out.floating_point_range = [
                FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)
            ]
        elif spec.kind == "int":
            out.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=1)]
    return out


class NodeParameters:
    """Declares a node's parameters, validates them, and applies runtime changes.

    Attributes are not used: read values with `self[name]` (always validated and converted).
    """

    def __init__(
        self,
        node: Any,
        specs: Iterable[ParamSpec],
        dependent: Callable[[Mapping[str, Any]], Iterable[ParamSpec]] | None = None,
    ) -> None:
        """Declares every spec on `node` and validates the start-up values.

        Args:
            node: The rclpy node.
            specs: Its parameters.
            dependent: Given the validated values of `specs`, more specs to declare (for
                example `cameras.<name>.*` for every name in `camera_names`).

        Raises:
            ParameterError: Listing every invalid start-up value.
        """
        self._node = node
        self._specs: dict[str, ParamSpec] = {}
        self._values: dict[str, Any] = {}
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        errors = self._declare(specs)
        if dependent is not None and not errors:
            errors = self._declare(dependent(self._values))
        if errors:
            raise ParameterError("; ".join(errors))
        node.add_on_set_parameters_callback(self._on_set)
        node.add_post_set_parameters_callback(self._on_post_set)

    def _declare(self, specs: Iterable[ParamSpec]) -> list[str]:
        from rclpy.exceptions import InvalidParameterValueException

        errors = []
        node = self._node
        for spec in specs:
            self._specs[spec.name] = spec
            try:
                param = node.declare_parameter(spec.name, spec.default, descriptor(spec))
            except InvalidParameterValueException:  # outside the range: the check says why
                plain = descriptor(spec, with_range=False)
                param = node.declare_parameter(spec.name, spec.default, plain)
            value, reason = validate(spec, param.value)
            if reason:
                errors.append(reason)
            else:
                self._values[spec.name] = value
        return errors

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def values(self) -> Mapping[str, Any]:
        return dict(self._values)

    def add_listener(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Calls `callback({name: value})` after accepted runtime changes."""
        self._listeners.append(callback)

    def _on_set(self, params: list) -> Any:
        from rcl_interfaces.msg import SetParametersResult

        for param in params:
            spec = self._specs.get(param.name)
            if spec is None:
                continue  # not ours (for example use_sim_time)
            if not spec.runtime:
                return SetParametersResult(
                    successful=False, reason=f"{param.name} is read-only: restart the node"
                )
            _, reason = validate(spec, param.value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        return SetParametersResult(successful=True)

    def _on_post_set(self, params: list) -> None:
        changed = {}
        for param in params:
            spec = self._specs.get(param.name)
            if spec is None:
                continue
            value, reason = validate(spec, param.value)
            if reason is None:
                self._values[param.name] = value
                changed[param.name] = value
        if changed:
            for listener in self._listeners:
                listener(changed)
