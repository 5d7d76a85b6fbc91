"""What `status` and `up` show of a fleet: the status line, the replica rows, the curl to try,
with known answers."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

from servepilot.engine.process import ReplicaInfo
from servepilot.engine.startup_log import KvCapacity
from servepilot.fleet import control, detach, up
from servepilot.fleet.state import FleetRecord, FleetState, ReplicaRecord

RECORD = FleetRecord(
    pid=4242,
    gateway_url="http://127.0.0.1:8000",
    port=8000,
    started_at_s=0.0,
    run_dir="/tmp/run",
    replicas=(),
)


def replica(kv: KvCapacity | None) -> ReplicaInfo:
    return ReplicaInfo("r0", "http://127.0.0.1:8101", 77, Path("/tmp/r0.log"), kv, 41.6)


def test_status_line_says_whether_the_fleet_serves() -> None:
    serving = control.FleetStatus(RECORD, True, (), None)
    assert control.status_line(serving) == (
        "fleet on port 8000: serving, endpoint http://127.0.0.1:8000/v1, pid 4242\nlogs: /tmp/run"
    )
    stale = control.FleetStatus(RECORD, False, (), "its `servepilot up` is gone")
    assert control.status_line(stale).startswith("fleet on port 8000: stale,")


def test_status_rows_read_the_gateways_replica_answer() -> None:
    healthy = {
        "id": "r0",
        "url": "http://h:1",
        "healthy": True,
        "in_flight": 3,
        "running": 2,
        "waiting": 1,
        "kv_cache_usage": 0.456,
    }
    assert control.replica_cells(healthy) == (
        "r0", "http://h:1", "yes", "3", "2", "1", "46%", "-",
    )  # fmt: skip
    unknown = control.replica_cells({"id": "r1", "healthy": False})
    assert unknown == ("r1", "None", "NO", "None", "None", "None", "0%", "-")
    assert len(unknown) == len(control.REPLICA_COLUMNS)


def test_status_says_which_replicas_prefix_caches_are_known_and_why_others_are_guessed() -> None:
    exact = {"id": "r0", "prefix_index": "exact"}
    guessed = {"id": "r2", "prefix_index": "guessed",
               "prefix_index_why": "KV events are not flowing from r2"}  # fmt: skip
    assert control.replica_cells(exact)[-1] == "exact"
    assert control.replica_cells(guessed)[-1] == "guessed"
    assert control.guessed_lines((exact, guessed)) == [
        "r2: prefix cache guessed: KV events are not flowing from r2"
    ]


def test_up_rows_and_ready_line_say_what_the_replica_reported() -> None:
    kv = KvCapacity(kv_capacity_tokens=93_184, max_model_len_tokens=8192, max_concurrency=11.375)
    assert up.replica_cells(replica(kv)) == (
        "r0",
        "http://127.0.0.1:8101",
        "77",
        "93,184",
        "11.4 x 8,192 tokens",
    )
    assert up.replica_cells(replica(None))[3:] == ("?", "?")
    assert up.replica_cells(replica(KvCapacity(1000, None, None)))[3:] == ("1,000", "?")
    assert up.ready_line(replica(kv)) == (
        "replica r0 ready at http://127.0.0.1:8101 in 42 s (93,184 KV tokens)"
    )
    assert up.ready_line(replica(None)).endswith("(KV capacity not reported)")


def test_curl_example_is_a_shell_command_for_the_served_model() -> None:
    started = up.UpStarted("http://127.0.0.1:8000", "it's-mine", ())
    words = shlex.split(started.curl_example)
    assert words[:2] == ["curl", "http://127.0.0.1:8000/v1/chat/completions"]
    assert words[2:4] == ["-H", "Content-Type: application/json"]
    assert json.loads(words[5]) == {
        "model": "it's-mine",
        "messages": [{"role": "user", "content": "Hello!"}],
    }


def test_status_line_of_a_starting_fleet_names_the_replicas_it_waits_for() -> None:
    replicas = tuple(
        ReplicaRecord(f"r{i}", f"http://h:{i}", 100 + i, f"/tmp/r{i}.log", ready=i == 1)
        for i in range(3)
    )
    rec = replace(RECORD, replicas=replicas, state=FleetState.STARTING)
    assert control.status_line(control.FleetStatus(rec, True, (), None)) == (
        "fleet on port 8000: starting (1 of 3 replicas ready; waiting for r0, r2), "
        "endpoint http://127.0.0.1:8000/v1, pid 4242\nlogs: /tmp/run"
    )


def test_up_steps_carry_the_wall_clock_time() -> None:
    said: list[str] = []
    reporter = up.UpReporter(step=said.append, serving=lambda _: None, warn=said.append)
    reporter.replica_ready(replica(None))
    reporter.warn("replica r0 exited")
    assert re.fullmatch(r"\d\d:\d\d:\d\d replica r0 ready at .*", said[0])
    assert re.fullmatch(r"\d\d:\d\d:\d\d replica r0 exited", said[1])


def test_down_says_how_each_fleet_stopped() -> None:
    def line(how: str) -> tuple[bool, str]:
        return control.outcome_line(control.StopOutcome(RECORD, how, ()), 90.0)

    assert line("drained") == (False, "fleet on port 8000 stopped")
    assert line("killed") == (True, "fleet on port 8000 did not stop in 90 s; killed")
    assert line("stale") == (False, "fleet on port 8000 was already gone; cleaned up its record")


def test_a_failed_detached_up_is_explained_by_its_last_error() -> None:
    log = (
        "• 14:50:42 starting 2 simulated replica(s); logs in /runs/1\n"
        "error: replica r0 (http://127.0.0.1:1) exited with code 1 before it was ready; full "
        "log: \n"
        "/runs/1/replica-r0.log\n"
        "  probable cause: exited with code 1; see the log below\n"
        "    Traceback (most recent call last):\n"
    )
    assert detach.failure_reason(log) == (
        "replica r0 (http://127.0.0.1:1) exited with code 1 before it was ready; full log: "
        "/runs/1/replica-r0.log"
    )
    taken = "error: port 8000 on 127.0.0.1 is already in use\n  hint: pass --port\n"
    assert detach.failure_reason(taken) == "port 8000 on 127.0.0.1 is already in use"
    assert detach.failure_reason("• starting\nKilled\n") == "Killed"
    assert detach.failure_reason("") == "it printed nothing"


def test_a_detached_fleet_is_told_to_stop_with_down_not_ctrl_c() -> None:
    started = up.UpStarted("http://127.0.0.1:8000", "m", (), detached=True)
    assert "stop:     `servepilot down`\n" in started.endpoint_text
    assert "Ctrl-C" in up.UpStarted("http://127.0.0.1:8000", "m", ()).endpoint_text
    # Off the default port, the commands name the port: a bare `down` stops every fleet.
    other = up.UpStarted("http://127.0.0.1:8080", "m", (), detached=True).endpoint_text
    assert "stop:     `servepilot down --port 8080`\n" in other
    assert "logs:     `servepilot logs [r0|gateway|access] [-f] --port 8080`\n" in other


def test_the_endpoint_text_says_whether_the_gateway_runs_compiled() -> None:
    # `make serve` builds the gateway's data path; a user should see whether it took, as
    # `servepilot gateway` prints at its start.
    from servepilot.core import accel

    text = up.UpStarted("http://127.0.0.1:8000", "m", ()).endpoint_text
    line = text.splitlines()[-1]
    assert line == f"gateway:  data path {accel.status(accel.GATEWAY)}"
    assert line.startswith(("gateway:  data path compiled", "gateway:  data path pure Python"))


def test_a_detached_ups_error_is_held_back_from_the_echo_and_quoted_whole() -> None:
    echoed: list[str] = []
    output = detach.HeldError(echoed.append)
    for chunk in (
        "• 14:50:42 starting\n• 14:5",
        "0:43 replica r0 ready\nerror: replica r1 ",
        "exited\n  probable cause: OOM\n  hint: give it more\nmemory\n    trace\n",
    ):
        output.feed(chunk)
    assert echoed == ["• 14:50:42 starting\n", "• 14:50:43 replica r0 ready\n"]
    error = detach.failed_start(1, output.held, Path("/runs/1/up.log"))
    assert error.message == (
        "the fleet did not start; its `up` exited with code 1: replica r1 exited\n"
        "  probable cause: OOM\n    trace"
    )
    assert error.hint == "give it more memory; nothing is left running; log: /runs/1/up.log"
    output.release()  # e.g. it served after all: nothing is lost
    assert echoed[-1].startswith("error: replica r1 exited\n")
