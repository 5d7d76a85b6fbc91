"""`Slo`: the latency limits that bench, sim and tune measure against, and their one parser.

A limit bounds one statistic of one metric, keyed `<metric>_<statistic>_ms` as bench reports
them (core/results.py `Stats`): ttft_p99_ms, itl_p50_ms, e2e_mean_ms, ... The p99 limits of
TTFT, TPOT and E2E are also per-request limits: goodput counts the requests within each of
them. Those three are the fields (fleet.yaml's `slo:` section, and the `slo` of the result
JSON); the --slo of tune may also bound any other statistic, kept in `limits` in the order given.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from servepilot.core.errors import ConfigError


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


class Slo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    ttft_p99_ms: float | None = Field(default=None, gt=0)
    """Target P99 time to first token; None sets no target."""

    tpot_p99_ms: float | None = Field(default=None, gt=0)
    """Target P99 time per output token; None sets no target."""

    e2e_p99_ms: float | None = Field(default=None, gt=0)
    """Target P99 end-to-end latency; None sets no target."""

    # Not a field: fleet.yaml's schema (what `servepilot config` prints) names only the
    # per-request limits above; these are all the limits, those included, in the order given.
    _limits: tuple[SloLimit, ...] = PrivateAttr(default=())

    def model_post_init(self, context: Any, /) -> None:
        if not self._limits:
            self._limits = tuple(
                SloLimit(Metric(key.split("_")[0]), Statistic.P99, value)
                for key, value in self.as_dict().items()
            )

    @classmethod
    def of(cls, limits: Sequence[SloLimit]) -> Slo:
        """The SLO of these limits (the per-request ones among them also set the fields)."""
        slo = cls(**{lim.key: lim.limit_ms for lim in limits if lim.key in cls.model_fields})
        slo._limits = tuple(limits)
        return slo

    @property
    def limits(self) -> tuple[SloLimit, ...]:
        return self._limits

    def as_dict(self) -> dict[str, float]:
        """The per-request limits that are set: the result JSON's `slo` (servepilot.bench/v1)."""
        return {key: value for key, value in self.model_dump().items() if value is not None}

    def describe(self) -> str:
        """Every limit as `key=ms`, in the order given: `ttft_p99_ms=500, itl_p99_ms=50`."""
        return ", ".join(f"{lim.key}={lim.limit_ms:g}" for lim in self.limits)


PER_REQUEST_KEYS = tuple(Slo.model_fields)


def parse_slo(text: str, flag: str = "--slo", *, per_request: bool = False) -> Slo:
    """`ttft_p99_ms=500,tpot_p99_ms=50` -> Slo; errors name the flag and the bad part.

    `per_request`: only the limits a single request can be held to (bench's and sim's
    goodput), the keys in PER_REQUEST_KEYS.
    """
    limits: dict[str, SloLimit] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if per_request and (not sep or key not in PER_REQUEST_KEYS):
            known = ", ".join(PER_REQUEST_KEYS)
            raise ConfigError(f"{flag} {text!r}: {part!r} is not KEY=MS with KEY one of {known}")
        limit = _limit(key, value, text, flag) if sep else None
        if limit is None:
            raise ConfigError(
                f"{flag} {text!r}: {part.strip()!r} is not KEY=MS",
                hint="keys are <ttft|tpot|itl|e2e>_<p50|p90|p99|mean>_ms, e.g. ttft_p99_ms=500",
            )
        limits[key] = limit
    if not limits:
        raise ConfigError(f"{flag} {text!r}: no limit given", hint="e.g. --slo ttft_p99_ms=500")
    return Slo.of(tuple(limits.values()))


def _limit(key: str, value: str, text: str, flag: str) -> SloLimit | None:
    head, _, unit = key.rpartition("_")
    metric_name, _, stat_name = head.partition("_")
    if unit != "ms":
        return None
    try:
        metric = Metric(metric_name)
    except ValueError:
        return None
    if stat_name == "p95":
        raise ConfigError(
            f"{flag} {text!r}: {key}: bench measures p50, p90, p99 and the mean, not p95",
            hint=f"use {metric_name}_p90_ms or {metric_name}_p99_ms",
        )
    try:
        statistic = Statistic(stat_name)
    except ValueError:
        return None
    try:
        limit_ms = float(value)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: {key}: {value.strip()!r} is not a number") from None
    if not math.isfinite(limit_ms) or limit_ms <= 0:
        raise ConfigError(f"{flag} {text!r}: {key} must be a positive number of ms")
    return SloLimit(metric, statistic, limit_ms)
