"""calibrate/run.py without a server: the request's checks, the checks made before any probe,
and the sentence on a request's overheads."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servepilot.calibrate.fit import Fit
from servepilot.calibrate.run import Calibration, CalibrationRequest, calibrate, streaming_meta
from servepilot.core.errors import ConfigError, EngineError
from servepilot.plan.costmodel import CostModel

MODEL = CostModel(0.02, 0.0004, 0.003, 0.0015, 2e-6, 3e-9, source="test")


class RecordingView:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def step(self, message: str) -> None:
        self.seen.append(f"step: {message}")

    def warning(self, message: str) -> None:
        self.seen.append(f"warning: {message}")

    @contextlib.contextmanager
    def probing(self, probes: int) -> Iterator[Callable[[str], None]]:
        self.seen.append(f"probing {probes}")
        yield self.seen.append

    def fitted(self, calibration: Calibration) -> None:
        self.seen.append("fitted")


def _closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [("max_num_batched_tokens", 1, "--max-num-batched-tokens"),
     ("max_prompt_tokens", 1, "--max-prompt-tokens"),
     ("timeout_s", 0.0, "--timeout")],
)  # fmt: skip
def test_a_request_out_of_range_names_its_flag(field: str, value: float, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        CalibrationRequest("http://127.0.0.1:8000", Path("p.json"), **{field: value})
    CalibrationRequest("http://127.0.0.1:8000", Path("p.json"), max_num_batched_tokens=None)


def test_the_profile_path_is_checked_before_the_server(tmp_path: Path) -> None:
    view = RecordingView()
    with pytest.raises(ConfigError, match="is a folder"):
        calibrate(CalibrationRequest(_closed_url(), tmp_path), view)
    with pytest.raises(EngineError, match="cannot reach"):
        calibrate(CalibrationRequest(_closed_url(), tmp_path / "p.json"), view)
    assert view.seen == []  # nothing was probed, nothing was said
    assert not (tmp_path / "p.json").exists()


def test_the_overheads_say_what_a_request_costs_outside_its_steps() -> None:
    meta = {"endpoint": "chat", "prompt_overhead_tokens": 30, "request_overhead_ms": 4.25}
    timed = Calibration(Fit(MODEL, (), ()), meta).overheads()
    assert timed.startswith("chat adds 30 tokens to every prompt; a request spends 4.2 ms")
    untimed = Calibration(Fit(MODEL, (), ()), {**meta, "request_overhead_ms": None}).overheads()
    assert untimed.endswith("the server does not time requests itself: TTFT is taken as the step")
    assert "streams" not in timed
    streaming = Calibration(Fit(MODEL, (), ()), {**meta, "output_us_per_token": 61.5}).overheads()
    assert streaming.endswith("; the API server streams a token in 61.5 us")


def test_the_streaming_time_is_the_median_of_the_waves_steps_and_absent_unmeasured() -> None:
    """The profile's `output_us_per_token` (the simulator's API server streaming): the median
    of the full steps' spreads, in us; with no wave large enough, no key at all (0 would say
    it was measured free)."""
    assert streaming_meta([40e-6, 70e-6, 50e-6]) == {"output_us_per_token": 50.0}
    assert streaming_meta([]) == {}
