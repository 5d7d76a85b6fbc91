"""Shared real servers for integration tests: started once per session, always stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from servepilot.core.config import Device, EngineConfig, ModelConfig
from servepilot.engine.args import ServerSpec, launch_command
from servepilot.engine.model_source import resolve_model
from servepilot.engine.process import ReplicaInfo, ReplicaProcess, free_port
from tests.integration.fleetproc import RunningFleet
from tests.integration.fuzz_support import Crashes, Servers, running_servers, watching_crashes


@pytest.fixture(scope="session")
def vllm_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaInfo]:
    """One vLLM-CPU replica of the embedded model (prefix caching on), for bench tests."""
    model = resolve_model(ModelConfig())
    port = free_port()
    engine = EngineConfig(enable_prefix_caching=True)
    spec = ServerSpec(str(model.path), model.served_name, "127.0.0.1", port)
    log_path = Path(tmp_path_factory.mktemp("replica")) / "replica.log"
    proc = ReplicaProcess(
        "bench", launch_command(engine, spec, Device.CPU), spec_url(port), log_path
    )
    proc.start()
    try:
        yield asyncio.run(proc.wait_ready(engine.startup_timeout_s))
    finally:
        proc.stop(engine.stop_grace_s)


@pytest.fixture(scope="module")
def client(fleet: RunningFleet) -> openai.OpenAI:
    """The official client on the module's `fleet` (a fixture of the test module)."""
    return openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="unused", max_retries=0)


def spec_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


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
