"""`servepilot bench --workload agentic` against the simulated replica over real sockets: each
turn goes out its wait after the previous answer arrived, and carries that answer back (the
server counts it in the next prompt)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from servepilot.bench.tokenizer import LocalTokenizer
from servepilot.cli.main import main
from servepilot.core.config import GatewayConfig, ModelConfig, PolicyName
from servepilot.engine.model_source import resolve_model
from servepilot.engine.simserver.tokens import filler_text
from servepilot.load.agentic import AgenticSpec
from servepilot.load.sessions import session_script
from servepilot.load.workload import WorkloadKind, WorkloadSpec
from tests.integration.threaded_gateway import ThreadedGateway, Upstream
from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, ThreadedSim

ANSWER = 24
FLAGS = ["--workload", "agentic", "--turns", "3", "--input-tokens", "64",
         "--output-tokens", str(ANSWER), "--system-prompts", "2",
         "--system-prompt-tokens", "96", "--tool-tokens", "48", "--think-time", "0.2",
         "--tool-time", "0.1", "--return-fraction", "0.5", "--return-gap", "0.3",
         "--seed", "4"]  # fmt: skip
SPEC = WorkloadSpec(
    kind=WorkloadKind.AGENTIC, input_tokens=64, output_tokens=ANSWER, turns=3, seed=4,
    agentic=AgenticSpec(system_prompts=2, system_prompt_tokens=96, tool_tokens=48, think_s=0.2,
                        tool_s=0.1, return_fraction=0.5, return_gap_s=0.3),
)  # fmt: skip


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    # The model's real tokenizer and chat template: the answer's text re-tokenizes as vLLM's.
    folder = resolve_model(ModelConfig()).path
    with ThreadedSim([*BASE_ARGS, *COST_FLAGS, "--tokenizer", str(folder)]) as sim:
        yield sim.url


def test_one_session_at_a_time_waits_for_each_answer_and_sends_it_back(
    sim_url: str, tmp_path: Path
) -> None:
    code = main(["bench", "--url", sim_url, *FLAGS, "--concurrency", "1", "--requests", "9",
                 "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert (run["completed"], run["failed"]) == (9, 0)
    assert run["ttft_ms_first_turn"]["count"] == 3 and run["ttft_ms_returning"]["count"] == 6
    with (tmp_path / "requests.csv").open() as handle:
        rows = sorted(csv.DictReader(handle), key=lambda row: int(row["index"]))
    assert [int(row["turn"]) for row in rows] == [0, 1, 2] * 3
    tokenizer = LocalTokenizer(resolve_model(ModelConfig()).path)
    answer_tokens = len(tokenizer.encode(filler_text(ANSWER)))
    assert answer_tokens == ANSWER  # each filler word is one token
    for session in range(3):
        script = session_script(SPEC, session)
        turns = rows[3 * session : 3 * session + 3]
        for before, after, turn in zip(turns, turns[1:], script.turns[1:], strict=False):
            answered_s = float(before["intended_s"]) + float(before["e2e_ms"]) / 1000
            assert float(after["intended_s"]) >= answered_s + turn.wait_s - 0.002
            # The next prompt holds this one, the answer as the replica streamed it (its
            # filler words re-tokenized) with the assistant's role markers, and the new
            # message; without the answer it would be ANSWER tokens shorter.
            grown = int(after["input_tokens"]) - int(before["input_tokens"])
            assert 0 <= grown - turn.new_tokens - answer_tokens <= 8, (session, grown)


def test_an_open_loop_starts_sessions_at_its_rate_and_reports_them(
    sim_url: str, tmp_path: Path
) -> None:
    code = main(["bench", "--url", sim_url, *FLAGS, "--rate", "4", "--requests", "12",
                 "--warmup", "2", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    result = json.loads((tmp_path / "results.json").read_text())
    (run,) = result["runs"]
    assert run["completed"] == 12 and run["failed"] == 0
    assert result["workload"]["kind"] == "agentic"
    assert result["workload"]["return_gap_s"] == 0.3


@pytest.mark.parametrize(("policy", "kept"), [("session", True), ("round_robin", False)])
def test_the_session_id_lets_the_gateway_keep_a_session_on_one_replica(
    policy: str, kept: bool, tmp_path: Path
) -> None:
    with (
        ThreadedSim([*BASE_ARGS, *COST_FLAGS]) as a,
        ThreadedSim([*BASE_ARGS, *COST_FLAGS]) as b,
        ThreadedGateway(
            GatewayConfig(port=0, policy=PolicyName(policy)),
            [Upstream("sim-0", a.url), Upstream("sim-1", b.url)],
        ) as gateway,
    ):
        code = main(["bench", "--url", gateway.url, *FLAGS, "--return-fraction", "0",
                     "--concurrency", "1", "--requests", "9", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    with (tmp_path / "requests.csv").open() as handle:
        rows = sorted(csv.DictReader(handle), key=lambda row: int(row["index"]))
    # One session at a time, three turns each: where each session's turns went.
    placed = [{row["replica"] for row in rows[s : s + 3]} for s in (0, 3, 6)]
    assert all(len(replicas) == 1 for replicas in placed) is kept, placed
