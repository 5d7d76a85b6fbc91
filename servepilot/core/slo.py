"""`Slo`: the latency limits that bench, sim and tune measure against, and their one parser.

A limit bounds one statistic of one metric, keyed `<metric>_<statistic>_ms` as bench reports
them (core/results.py `Stats`): ttft_p99_ms, itl_p50_ms, e2e_mean_ms, ... An `Slo` is the limits
in the order given, written the same way everywhere: `--slo ttft_p99_ms=500,itl_p99_ms=50`,
fleet.yaml's `slo:` mapping, the result JSON's `slo`.

Two kinds of limit, one syntax:
- per-request: the p99 limits of TTFT, TPOT and E2E are also held to each request; goodput
  counts the requests within every one of them (bench's and sim's `goodput_rps`).
- level: every limit is a bound on a load level's statistic; bench and sim report the limits
  that are not per-request (itl_*, and p50/p90/mean of any metric) as each level's verdict
  (`slo_met`, `slo_violated`); tune holds every limit to the level's statistic.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from servepilot.core.errors import ConfigError
from servepilot.core.results import Run, Stats

KEY_FORMAT = "<ttft|tpot|itl|e2e>_<p50|p90|p99|mean>_ms"


class Metric(enum.StrEnum):
    TTFT = "ttft"
    TPOT = "tpot"
    ITL = "itl"
    E2E = "e2e"


class Statistic(enum.StrEnum):
    P50 = "p50"
    P90 = "p90"
    P99 = "p99"
    MEAN = "mean"


@dataclass(frozen=True, slots=True)
class SloLimit:
    metric: Metric
    statistic: Statistic
    limit_ms: float

    @property
    def key(self) -> str:
        return f"{self.metric.value}_{self.statistic.value}_ms"

    @property
    def per_request(self) -> bool:
        """Held to each request too: a p99 limit of a per-request latency (ITL is per gap)."""
        return self.statistic is Statistic.P99 and self.metric is not Metric.ITL

    def observed_ms(self, run: Run) -> float | None:
        """The run's value of this limit's statistic (None when the run measured none)."""
        stats: Stats = getattr(run, f"{self.metric.value}_ms")
        value: float | None = getattr(stats, self.statistic.value)
        return value


class Slo(BaseModel):
    """Latency limits, `key: ms` with keys <ttft|tpot|itl|e2e>_<p50|p90|p99|mean>_ms."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    limits: tuple[SloLimit, ...] = ()
    """Every limit, in the order given."""

    @model_validator(mode="before")
    @classmethod
    def _from_mapping(cls, data: Any) -> Any:
        # One representation: written as `key: ms` (fleet.yaml, `Slo(ttft_p99_ms=500)`).
        if data is None:
            return {"limits": ()}
        if not isinstance(data, Mapping):
            raise PydanticCustomError(
                "slo_limit", f"expected a mapping of limits, {KEY_FORMAT}: MS"
            )
        # `key: null` sets no limit, as the fleet.yaml `servepilot config` printed before did.
        given = {str(k): v for k, v in data.items() if v is not None}
        return {"limits": tuple(_limit(k, v) for k, v in given.items())}

    @model_serializer(mode="plain")
    def _to_mapping(self) -> dict[str, float]:
        return self.as_dict()

    @classmethod
    def of(cls, limits: tuple[SloLimit, ...]) -> Slo:
        return cls.model_validate({lim.key: lim.limit_ms for lim in limits})

    def as_dict(self) -> dict[str, float]:
        """Every limit as `key: ms` in the order given: fleet.yaml's `slo:`, the result JSON's."""
        return {lim.key: lim.limit_ms for lim in self.limits}

    def per_request_ms(self, metric: Metric) -> float | None:
        """The limit held to each request's `metric` (its p99 limit), None when none is set."""
        return next(
            (lim.limit_ms for lim in self.limits if lim.per_request and lim.metric is metric),
            None,
        )

    @property
    def level_limits(self) -> tuple[SloLimit, ...]:
        """The limits bench and sim check on each level's statistics (not per request)."""
        return tuple(lim for lim in self.limits if not lim.per_request)

    def violated(self, run: Run) -> tuple[str, ...]:
        """The keys of the level limits this run's statistics exceed (unmeasured ones pass)."""
        return tuple(
            lim.key
            for lim in self.level_limits
            if (observed := lim.observed_ms(run)) is not None and observed > lim.limit_ms
        )

    def with_verdict(self, run: Run) -> Run:
        """`run` with its level verdict: `slo_met` None when no level limit is set."""
        if not self.level_limits:
            return run
        missed = self.violated(run)
        return run.model_copy(update={"slo_met": not missed, "slo_violated": missed})

    def describe(self) -> str:
        """Every limit as `key=ms`, in the order given: `ttft_p99_ms=500, itl_p99_ms=50`."""
        return ", ".join(f"{lim.key}={lim.limit_ms:g}" for lim in self.limits)


def _limit(key: str, value: object) -> SloLimit:
    """fleet.yaml's `key: ms`; pydantic reports the error under `slo`, naming the key."""
    parsed = _key(key)
    if parsed is None:
        raise PydanticCustomError(
            "slo_limit", f"{key}: not a limit key; keys are {KEY_FORMAT}, e.g. ttft_p99_ms"
        )
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("slo_limit", f"{key}: {value!r} is not a number of ms")
    if not math.isfinite(value) or value <= 0:
        raise PydanticCustomError("slo_limit", f"{key} must be a positive number of ms")
    return SloLimit(*parsed, float(value))


def _key(key: str) -> tuple[Metric, Statistic] | None:
    """`ttft_p99_ms` -> (TTFT, P99); None for anything else (p95 raises: a likely slip)."""
    head, _, unit = key.rpartition("_")
    metric_name, _, stat_name = head.partition("_")
    if unit != "ms" or metric_name not in set(Metric):
        return None
    if stat_name == "p95":
        raise PydanticCustomError(
            "slo_limit",
            f"{key}: bench measures p50, p90, p99 and the mean, not p95 "
            f"(use {metric_name}_p90_ms or {metric_name}_p99_ms)",
        )
    if stat_name not in set(Statistic):
        return None
    return Metric(metric_name), Statistic(stat_name)


def parse_slo(text: str, flag: str = "--slo") -> Slo:
    """`ttft_p99_ms=500,itl_p99_ms=50` -> Slo; errors name the flag and the bad part.

    bench, sim and tune all take this syntax; a key given twice keeps its first place and its
    last value.
    """
    limits: dict[str, SloLimit] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = (s.strip() for s in part.partition("="))
        try:
            parsed = _key(key) if sep else None
        except PydanticCustomError as exc:
            raise ConfigError(f"{flag} {text!r}: {exc.message()}") from None
        if parsed is None:
            raise ConfigError(
                f"{flag} {text!r}: {part.strip()!r} is not KEY=MS",
                hint=f"keys are {KEY_FORMAT}, e.g. ttft_p99_ms=500",
            )
        limits[key] = SloLimit(*parsed, _ms(key, value, text, flag))
    if not limits:
        raise ConfigError(f"{flag} {text!r}: no limit given", hint="e.g. --slo ttft_p99_ms=500")
    return Slo.of(tuple(limits.values()))


def _ms(key: str, value: str, text: str, flag: str) -> float:
    try:
        limit_ms = float(value)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: {key}: {value!r} is not a number") from None
    if not math.isfinite(limit_ms) or limit_ms <= 0:
        raise ConfigError(f"{flag} {text!r}: {key} must be a positive number of ms")
    return limit_ms
