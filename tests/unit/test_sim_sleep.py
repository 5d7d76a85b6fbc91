"""The simulated replica's sleep mode (engine/simserver/sleep.py): vLLM's routes, answers and
semantics over real sockets, and the pure parts (levels, tags, durations)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from servepilot.engine.simserver.openai_api import ApiError
from servepilot.engine.simserver.sleep import (
    SleepTag,
    SleepTimes,
    parse_level,
    parse_tags,
    sleep_duration_s,
    tags_put_to_sleep,
    wake_duration_s,
)
from tests.unit.sim_support import BASE_ARGS, ThreadedSim

TIMES = SleepTimes(first_sleep_s=0.3, sleep_s=0.05, wake_s=0.1)
FLAGS = ["--step-ms", "2", "--enable-sleep-mode", "--first-sleep-s", "0.3", "--sleep-s",
         "0.05", "--wake-s", "0.1"]  # fmt: skip
# Four full blocks of 16 tokens at least: the prefix cache has something to hit.
PROMPT = "The same long system prompt, word after word after word. " * 12


@pytest.fixture
def sim() -> Iterator[ThreadedSim]:
    with ThreadedSim([*BASE_ARGS, *FLAGS]) as server:
        yield server


def _completion(url: str) -> httpx.Response:
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 2}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30)


def _prefix_hits(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("vllm:prefix_cache_hits_total"))
    return float(line.rsplit(" ", 1)[1])


def _timed_post(url: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(url, timeout=30)
    return response, time.monotonic() - started


def test_levels_tags_and_durations() -> None:
    assert tags_put_to_sleep(0) == {SleepTag.SCHEDULING}
    assert tags_put_to_sleep(1) == tags_put_to_sleep(2) == set(SleepTag)
    assert sleep_duration_s(TIMES, 1, slept_before=False) == 0.3
    assert sleep_duration_s(TIMES, 1, slept_before=True) == 0.05
    assert sleep_duration_s(TIMES, 0, slept_before=False) == 0.0
    assert wake_duration_s(TIMES, frozenset(SleepTag)) == 0.1
    assert wake_duration_s(TIMES, frozenset({SleepTag.KV_CACHE})) == 0.0
    assert parse_level("") == 1 and parse_level("level=2&mode=wait") == 2
    assert parse_tags("") is None
    assert parse_tags("tags=weights&tags=kv_cache") == {SleepTag.WEIGHTS, SleepTag.KV_CACHE}
    for bad_level in ("level=3", "level=x", "mode=later"):
        with pytest.raises(ApiError):
            parse_level(bad_level)
    with pytest.raises(ApiError, match="unknown tag 'ram'"):
        parse_tags("tags=ram")


def test_sleep_holds_requests_until_woken_and_drops_the_prefix_cache(sim: ThreadedSim) -> None:
    url = sim.url
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}
    _completion(url)
    _completion(url)
    hits = _prefix_hits(url)
    assert hits > 0  # the second prompt hit what the first cached

    slept, first_s = _timed_post(f"{url}/sleep?level=1")
    assert (slept.status_code, slept.content) == (200, b"")
    assert first_s >= 0.3  # the first sleep: --first-sleep-s
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
    assert httpx.get(f"{url}/health").status_code == 200
    # As vLLM's paused scheduler: the request is taken, and waits for the wake.
    answers: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: answers.append(_completion(url)))
    waiting.start()
    waiting.join(0.3)
    assert answers == []
    woken, wake_s = _timed_post(f"{url}/wake_up")
    assert (woken.status_code, woken.content) == (200, b"")
    assert wake_s >= 0.1
    waiting.join(10)
    assert answers[0].status_code == 200
    assert _prefix_hits(url) == hits  # the cache went with the sleep: no hit after it

    _, later_s = _timed_post(f"{url}/sleep")
    assert 0.05 <= later_s < 0.3  # a later sleep: --sleep-s
    httpx.post(f"{url}/wake_up?tags=weights")
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
    httpx.post(f"{url}/wake_up?tags=kv_cache&tags=scheduling")
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}


def test_bad_sleep_requests_are_400s(sim: ThreadedSim) -> None:
    bad = httpx.post(f"{sim.url}/sleep?level=5")
    assert bad.status_code == 400 and "level must be 0, 1 or 2" in bad.json()["error"]["message"]
    assert httpx.post(f"{sim.url}/wake_up?tags=ram").status_code == 400
    assert httpx.get(f"{sim.url}/is_sleeping").json() == {"is_sleeping": False}


def test_without_sleep_mode_there_are_no_sleep_routes() -> None:
    with ThreadedSim([*BASE_ARGS, "--step-ms", "2"]) as plain:
        for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
            answer = httpx.request(method, f"{plain.url}{path}")
            assert (answer.status_code, answer.json()) == (404, {"detail": "Not Found"})
