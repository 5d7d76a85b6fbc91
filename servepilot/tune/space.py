"""What a trial runs with, and the space the search moves in.

A `TrialConfig` is one value per knob, kept in a canonical order so two equal configurations
have one key (`key`: a hash of the canonical JSON), which is what trials.jsonl is keyed by.
A `SearchSpace` gives each knob an ordered ladder of values (`Axis`), the starting point (the
planner's configuration) and the planner's verdict on any point (`check`): a configuration
the planner says will not fit is never launched.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

Value = int | float | str


class Knob(enum.StrEnum):
    """The knobs tune moves, by their fleet.yaml names (engine.<name>)."""

    MAX_NUM_SEQS = "max_num_seqs"
    MAX_NUM_BATCHED_TOKENS = "max_num_batched_tokens"
    MAX_MODEL_LEN = "max_model_len"
    GPU_MEMORY_UTILIZATION = "gpu_memory_utilization"
    CPU_KV_CACHE_SPACE_GIB = "cpu_kv_cache_space_gib"
    KV_CACHE_DTYPE = "kv_cache_dtype"
    WEIGHTS_DTYPE = "weights_dtype"
    TENSOR_PARALLEL_SIZE = "tensor_parallel_size"
    """With the accelerators fixed, TP also sets the replica count (devices / TP)."""


@dataclass(frozen=True, slots=True)
class TrialConfig:
    """One value per knob, sorted by knob: equal configurations are equal objects."""

    values: tuple[tuple[Knob, Value], ...]

    @staticmethod
    def of(mapping: Mapping[Knob, Value]) -> TrialConfig:
        return TrialConfig(tuple(sorted(mapping.items(), key=lambda kv: kv[0].value)))

    def get(self, knob: Knob) -> Value:
        for name, value in self.values:
            if name is knob:
                return value
        raise KeyError(knob.value)

    def has(self, knob: Knob) -> bool:
        return any(name is knob for name, _ in self.values)

    def with_value(self, knob: Knob, value: Value) -> TrialConfig:
        return TrialConfig.of({**dict(self.values), knob: value})

    def as_dict(self) -> dict[str, Value]:
        return {name.value: value for name, value in self.values}

    @property
    def key(self) -> str:
        """A short hash of the canonical JSON: the trial's identity across runs."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self, *, against: TrialConfig | None = None) -> str:
        """`max_num_seqs=64 max_num_batched_tokens=2048`; with `against`, only what differs."""
        parts = [
            f"{name.value}={_fmt(value)}"
            for name, value in self.values
            if against is None or not against.has(name) or against.get(name) != value
        ]
        return " ".join(parts) or "(same)"


def config_from_dict(data: Mapping[str, object]) -> TrialConfig:
    """The inverse of `as_dict` (for trials.jsonl); raises ValueError on anything else."""
    values: dict[Knob, Value] = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"{name}: {value!r} is not a knob value")
        values[Knob(name)] = value
    return TrialConfig.of(values)


@dataclass(frozen=True, slots=True)
class Axis:
    """A knob's ladder of values, in order; moving +1 goes up the ladder."""

    knob: Knob
    values: tuple[Value, ...]
    coarse_step: int = 1
    """Ladder positions of one coarse move (2 on the x1.5 ladders: a doubling)."""

    def index(self, value: Value) -> int | None:
        return self.values.index(value) if value in self.values else None

    def moved(self, value: Value, steps: int) -> Value | None:
        """The value `steps` positions away (clamped to the ends); None if that is `value`."""
        at = self.index(value)
        if at is None:
            return None
        target = min(len(self.values) - 1, max(0, at + steps))
        return None if target == at else self.values[target]


Check = Callable[[TrialConfig], str | None]
"""The planner's verdict on a configuration: None when it fits, else why it does not."""


@dataclass(frozen=True, slots=True)
class SearchSpace:
    axes: tuple[Axis, ...]
    default: TrialConfig
    """The planner's configuration: the first trial and the baseline of the gain."""
    check: Check
    notes: tuple[str, ...] = ()
    """What the space leaves out and why (shown in the report)."""

    def axis(self, knob: Knob) -> Axis | None:
        return next((a for a in self.axes if a.knob is knob), None)

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return tuple(a.knob for a in self.axes)

    def size(self) -> int:
        total = 1
        for axis in self.axes:
            total *= len(axis.values)
        return total


def ladder(low: int, high: int, *, extra: Iterable[int] = ()) -> tuple[int, ...]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... (powers of two and their x1.5) within [low, high], plus
    `extra` values (the planner's own) that fall in it."""
    values: set[int] = set()
    power = 1
    while power <= high:
        for value in (power, power * 3 // 2):
            if low <= value <= high:
                values.add(value)
        power *= 2
    values.update(v for v in extra if low <= v <= high)
    return tuple(sorted(values))


def _fmt(value: Value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
