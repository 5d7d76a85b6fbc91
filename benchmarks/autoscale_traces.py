"""The arrival-rate traces of `bench_autoscale.py`: three shapes (a diurnal swing, a ramp
faster than a cold start, bursts), each shipped with the benchmark, and held-out variants of
each (other seeds, other peaks, slopes and burst spacing) that no policy constant was chosen
on: a policy that only fits the shipped three shows it on the held-out ones."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MINUTE = 60.0


@dataclass(frozen=True, slots=True)
class Diurnal:
    """`low` -> `high` -> `low` req/s on a cosine of `period_s`."""

    low: float
    high: float
    period_s: float

    def rate(self, t: float) -> float:
        swing = (1.0 - math.cos(2.0 * math.pi * t / self.period_s)) / 2.0
        return self.low + (self.high - self.low) * swing

    def describe(self) -> str:
        swing = f"{self.low:g} -> {self.high:g} -> {self.low:g} req/s"
        return f"{swing} on a {self.period_s / MINUTE:g}-min cosine"


@dataclass(frozen=True, slots=True)
class Ramp:
    """`low` req/s until `up_at_s`, linearly up to `high` in `up_s`, held `hold_s`, linearly
    back down to `low` in `down_s`."""

    low: float
    high: float
    up_at_s: float
    up_s: float
    hold_s: float
    down_s: float

    def rate(self, t: float) -> float:
        into = t - self.up_at_s
        span = self.high - self.low
        if into < 0:
            return self.low
        if into < self.up_s:
            return self.low + span * into / self.up_s
        into -= self.up_s + self.hold_s
        if into < 0:
            return self.high
        return max(self.low, self.high - span * into / self.down_s)

    def describe(self) -> str:
        slope = (self.high - self.low) / (self.up_s / MINUTE)
        return (
            f"{self.low:g} req/s for {self.up_at_s / MINUTE:g} min, +{slope:g} req/s a minute to "
            f"{self.high:g}, held {self.hold_s / MINUTE:g} min, back in {self.down_s / MINUTE:g}"
        )


@dataclass(frozen=True, slots=True)
class Bursts:
    """`base` req/s, and from each of `starts_s` a burst to `high` req/s for `length_s`,
    reached linearly in `rise_s`."""

    base: float
    high: float
    starts_s: tuple[float, ...]
    length_s: float
    rise_s: float

    def rate(self, t: float) -> float:
        for start in self.starts_s:
            into = t - start
            if 0.0 <= into < self.length_s:
                return self.base + (self.high - self.base) * min(1.0, into / self.rise_s)
        return self.base

    def describe(self) -> str:
        at = ", ".join(f"{s / MINUTE:g}" for s in self.starts_s)
        return (
            f"{self.base:g} req/s, bursts to {self.high:g} req/s rising in {self.rise_s:g} s, "
            f"{self.length_s / MINUTE:g} min each, from minutes {at}"
        )


Shape = Diurnal | Ramp | Bursts


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    duration_s: float
    shape: Shape
    seed: int

    @property
    def peak_rps(self) -> float:
        return self.shape.high

    def rate(self, t: float) -> float:
        return self.shape.rate(t)

    def arrivals(self) -> list[float]:
        """The send times: Poisson at the peak rate, each kept with probability
        rate(t) / peak (thinning), from the trace's own seed."""
        rng = random.Random(self.seed)
        peak = self.peak_rps
        out: list[float] = []
        t = 0.0
        while True:
            t += rng.expovariate(peak)
            if t >= self.duration_s:
                return out
            if rng.random() * peak < self.rate(t):
                out.append(t)


SHIPPED = {
    "diurnal": Trace("diurnal", 40 * MINUTE, Diurnal(20.0, 125.0, 40 * MINUTE), seed=1),
    "ramp": Trace(
        "ramp", 30 * MINUTE, Ramp(25.0, 125.0, 8 * MINUTE, 8 * MINUTE, 8 * MINUTE, 6 * MINUTE), 2
    ),
    "bursts": Trace(
        "bursts",
        30 * MINUTE,
        Bursts(40.0, 110.0, (4 * MINUTE, 11 * MINUTE, 17 * MINUTE, 24 * MINUTE), 3 * MINUTE, 10.0),
        seed=3,
    ),
}
"""The traces the policies were first measured on (issue 17's evidence)."""

HELD_OUT = {
    "diurnal-b": Trace("diurnal-b", 36 * MINUTE, Diurnal(30.0, 100.0, 36 * MINUTE), seed=21),
    "ramp-b": Trace(
        "ramp-b",
        30 * MINUTE,
        Ramp(30.0, 110.0, 6 * MINUTE, 5 * MINUTE, 10 * MINUTE, 9 * MINUTE),
        22,
    ),
    "bursts-b": Trace(
        "bursts-b",
        30 * MINUTE,
        Bursts(
            30.0,
            90.0,
            (3 * MINUTE, 9.5 * MINUTE, 14 * MINUTE, 20 * MINUTE, 26 * MINUTE),
            2 * MINUTE,
            20.0,
        ),
        seed=23,
    ),
}
"""Written after the policy's rules were: other seeds, peaks (100, 110, 90 req/s), a steeper
ramp (+16 req/s a minute) with a longer hold and a slower fall, five shorter bursts at uneven
spacing (4.5 to 6.5 min) that rise in 20 s."""

TRACES = SHIPPED | HELD_OUT
