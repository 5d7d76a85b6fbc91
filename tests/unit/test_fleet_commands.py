"""`servepilot logs`: which file it reads (running fleet, last run), following a file, the
gateway's log file, and the CLI around it (with no arguments, `models list`); one fleet a
port, even while it starts."""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

import servepilot
from servepilot.cli.main import main
from servepilot.core.errors import FleetError
from servepilot.fleet import logs
from servepilot.fleet.state import FleetRecord, FleetState, check_no_fleet, write_record


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SERVEPILOT_STATE", str(tmp_path))
    return tmp_path


def _run(state: Path, name: str, files: dict[str, str]) -> Path:
    run_dir = state / "runs" / name
    run_dir.mkdir(parents=True)
    for filename, text in files.items():
        (run_dir / filename).write_text(text)
    return run_dir


def _record(port: int, run_dir: Path, pid: int) -> FleetRecord:
    return FleetRecord(pid, f"http://127.0.0.1:{port}", port, 0.0, str(run_dir), ())


def test_the_running_fleets_log_comes_before_newer_runs(state: Path) -> None:
    running = _run(state, "20260101-100000-1", {"gateway.log": "g", "replica-r0.log": "r0"})
    _run(state, "20260102-100000-2", {"gateway.log": "newer"})
    write_record(_record(8000, running, os.getpid()))
    assert logs.find_log("r0", None) == logs.LogSource(running / "replica-r0.log", os.getpid())
    assert logs.find_log("replica-r0", 8000).path == running / "replica-r0.log"
    assert logs.find_log("gateway", None).path == running / "gateway.log"
    with pytest.raises(FleetError, match="no fleet has run on port 9999"):
        logs.find_log("gateway", 9999)
    with pytest.raises(FleetError, match=r"replica-r7\.log does not exist") as err:
        logs.find_log("r7", None)
    assert err.value.hint == "the logs of this run: gateway, r0"
    write_record(_record(8001, running, os.getpid()))
    with pytest.raises(FleetError, match="fleets run on ports 8000, 8001"):
        logs.find_log("gateway", None)


def test_with_no_fleet_running_the_newest_run_is_read(state: Path) -> None:
    with pytest.raises(FleetError, match="no fleet has run yet"):
        logs.find_log("gateway", None)
    _run(state, "20260101-100000-1", {"gateway.log": "old"})
    newest = _run(state, "20260102-090000-2", {"gateway.log": "new"})
    assert logs.find_log("gateway", None) == logs.LogSource(newest / "gateway.log", None)
    assert "".join(logs.log_chunks("gateway", None, follow=False)) == "new"


def test_tail_gives_what_is_appended_until_told_to_stop(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_text("one\n")
    polls = iter([True, False])

    def keep_going() -> bool:
        with open(path, "a") as f:
            f.write("two\n")
        return next(polls)

    assert "".join(logs.tail(path, keep_going)) == "one\ntwo\ntwo\n"


def test_gateway_log_keeps_the_gateways_records_in_the_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool_log = logging.getLogger("servepilot.gateway.pool")
    with logs.gateway_log(tmp_path):
        pool_log.info("replica r0 added")
        pool_log.warning("replica r0 is down")
    pool_log.warning("after the run")
    lines = (tmp_path / "gateway.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "INFO servepilot.gateway.pool: replica r0 added",
        "WARNING servepilot.gateway.pool: replica r0 is down",
    ]
    assert capsys.readouterr().err.splitlines()[0] == "replica r0 is down"


def test_servepilot_alone_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: servepilot")
    assert "logs" in out and "status" in out


def test_version_prints_the_packages_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"servepilot {servepilot.__version__}\n"


def test_models_list_shows_the_presets_and_which_one_vllm_serves(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["models", "list"]) == 0
    rows = {
        line.split()[0]: line.split()[1:]
        for line in capsys.readouterr().out.splitlines()[3:]
        if line.strip()
    }
    assert rows["smollm2"] == ["0.135B", "LlamaForCausalLM", "up", "(vLLM),", "plan,", "sim"]
    assert rows["llama-3.1-8b"][:2] == ["8.03B", "LlamaForCausalLM"]
    assert rows["llama-3.1-8b"][2:4] == ["up", "--engine"]


def test_a_second_up_on_the_port_of_a_starting_fleet_is_refused(state: Path) -> None:
    starting = replace(_record(8000, state, os.getpid()), state=FleetState.STARTING)
    write_record(starting)
    with pytest.raises(FleetError, match=r"a fleet is already starting on port 8000 \(pid"):
        check_no_fleet(8000)
    check_no_fleet(8001)
    write_record(replace(starting, pid=_dead_pid()))
    check_no_fleet(8000)  # a stale record holds nothing


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
