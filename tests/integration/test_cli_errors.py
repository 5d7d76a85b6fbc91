"""The CLI refuses bad input with a clear message, never a traceback."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.integration.fleetproc import cli


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "SERVEPILOT_STATE": str(tmp_path / "state")}


def test_unknown_config_field_is_named(tmp_path: Path, env: dict[str, str]) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text("engine:\n  max_num_seq: 8\n")
    result = cli(["up", "-c", str(fleet_yaml)], env)
    assert result.returncode == 2
    assert "engine.max_num_seq: unknown field; did you mean `max_num_seqs`?" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["up", "--replicas", "0"], "--replicas (replicas.count)"),
        (["plan", "--qps", "-5"], "--qps (traffic.target_qps)"),
        (["plan", "--max-model-len", "0"], "--max-model-len (engine.max_model_len)"),
        (["sim", "--replicas", "0", "--requests", "1"], "--replicas (replicas.count)"),
        (["gateway", "--replica", "http://127.0.0.1:9", "--capacity", "0"],
         "--capacity (gateway.admission.replica_concurrency)"),
    ],
)  # fmt: skip
def test_bad_flag_value_names_the_flag_and_its_field(
    argv: list[str], named: str, env: dict[str, str]
) -> None:
    result = cli(argv, env)
    assert result.returncode == 2
    assert named in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_model_folder_is_named(tmp_path: Path, env: dict[str, str]) -> None:
    missing = tmp_path / "no-such-model"
    result = cli(["up", "--model", str(missing)], env)
    assert result.returncode == 1
    assert str(missing) in result.stderr
    assert "Traceback" not in result.stderr


def test_gateway_port_in_use_fails_before_starting_replicas(env: dict[str, str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli(["up", "--port", str(port)], env, timeout_s=60)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "starting" not in result.stderr


@pytest.mark.vllm
def test_replica_that_fails_to_start_is_reported_with_its_cause(
    tmp_path: Path, env: dict[str, str]
) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text("engine:\n  extra_args: [--no-such-vllm-flag]\n")
    result = cli(["up", "-c", str(fleet_yaml), "--port", "0"], env, timeout_s=300)
    assert result.returncode == 1
    assert "replica r0" in result.stderr and "exited with code 2" in result.stderr
    assert "probable cause: bad argument" in result.stderr
    assert "unrecognized arguments: --no-such-vllm-flag" in result.stderr  # the log tail
    assert "Traceback" not in result.stderr.split("last lines of the replica's log")[0]
    assert not list((tmp_path / "state" / "fleets").glob("*.json"))


def test_gateway_needs_http_urls(env: dict[str, str]) -> None:
    result = cli(["gateway", "--replica", "localhost:8001"], env)
    assert result.returncode == 2
    assert "--replica 'localhost:8001'" in result.stderr


def test_help_is_written_for_users() -> None:
    result = cli(["--help"], dict(os.environ))
    assert result.returncode == 0
    for command in ("up", "status", "down", "gateway", "models", "config"):
        assert command in result.stdout
