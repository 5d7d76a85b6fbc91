"""bench reads the replicas' own prefix-cache counters around each level: a second run with
the same --seed sends prompts they have cached, and bench says so (the simulated replica
keeps vLLM's prefix cache and exports its counters under vLLM's names, over real sockets).

Completions, not chat: every chat prompt opens with the same system prompt, and the simulated
replica keeps one cached chain per shared first block (engine/simserver/prefixmap.py), so it
would find only one of several repeated chats whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from servepilot.bench.prefix_cache import CacheCount, hit_rate
from servepilot.cli.main import main
from servepilot.core.config import GatewayConfig, ModelConfig
from servepilot.engine.model_source import resolve_model
from tests.integration.threaded_gateway import ThreadedGateway, Upstream
from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, ThreadedSim

FLAGS = ["--endpoint", "completions", "--requests", "6", "--input-tokens", "256",
         "--output-tokens", "4", "--concurrency", "2"]  # fmt: skip
WARNING = "from their prefix cache: an earlier bench with --seed"


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    folder = resolve_model(ModelConfig()).path
    with ThreadedSim([*BASE_ARGS, *COST_FLAGS, "--tokenizer", str(folder)]) as sim:
        yield sim.url


def _bench(url: str, seed: int, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[float, str]:
    code = main(["bench", "--url", url, *FLAGS, "--seed", str(seed), "--out", str(out)])
    assert code == 0
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    captured = capsys.readouterr()
    return run["prefix_cache_hit_rate"], captured.out + captured.err


def test_a_second_run_with_the_same_seed_is_served_from_the_cache_and_told(
    sim_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, said = _bench(sim_url, 31, tmp_path / "a", capsys)
    # New prompts share nothing.
    assert first == 0.0 and WARNING not in said
    again, said = _bench(sim_url, 31, tmp_path / "b", capsys)
    # The same prompts: each 256-token prompt is two blocks of 128 (vLLM's block on CPU), and
    # the one holding its last token is computed again (vLLM always computes that token).
    assert again == pytest.approx(128 / 256)
    assert WARNING in said and "--seed 31" in said
    other, said = _bench(sim_url, 32, tmp_path / "c", capsys)
    assert other == 0.0 and WARNING not in said


def test_behind_a_gateway_the_replicas_it_lists_are_read(
    sim_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _bench(sim_url, 41, tmp_path / "direct", capsys)
    with ThreadedGateway(GatewayConfig(port=0), [Upstream("r0", sim_url)]) as gateway:
        rate, said = _bench(gateway.url, 41, tmp_path / "gateway", capsys)
    assert rate == pytest.approx(128 / 256) and WARNING in said


def test_the_hit_rate_needs_two_readings_and_a_lookup() -> None:
    before, after = CacheCount(1_000, 100), CacheCount(3_000, 1_600)
    assert hit_rate(before, after) == pytest.approx(0.75)
    assert hit_rate(None, after) is None and hit_rate(before, None) is None
    assert hit_rate(after, after) is None  # nothing looked up
    # A replica restarted between the readings: its counters went back to zero.
    assert hit_rate(after, CacheCount(500, 100)) is None
