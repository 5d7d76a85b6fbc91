"""Workloads and exact-length prompts, checked with the embedded model's real tokenizer.

The tokenizer is SmolLM2's, loaded from the converted model folder (`make model`); the
server-tokenizer path is exercised against a small fake /tokenize server backed by it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import random
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from servepilot.bench.prompts import MAX_SLICES, PromptMaker
from servepilot.bench.records import RequestSpec
from servepilot.bench.tokenizer import LocalTokenizer, ServerTokenizer, open_tokenizer
from servepilot.bench.workload import build_workload
from servepilot.core.config import ModelConfig
from servepilot.core.errors import ConfigError
from servepilot.engine.model_source import resolve_model
from servepilot.load.trace import load_trace
from servepilot.load.workload import WorkloadKind, WorkloadSpec, describe, parse_priority_mix


@pytest.fixture(scope="module")
def tok() -> LocalTokenizer:
    return LocalTokenizer(resolve_model(ModelConfig()).path)


def _counts(tok: LocalTokenizer, texts: Sequence[str]) -> list[int]:
    return [len(ids) for ids in tok.encode_batch(texts)]


# --- exact prompts -------------------------------------------------------------------------


@pytest.mark.parametrize(("n_tokens", "how_many"), [(1, 200), (7, 200), (128, 200), (1000, 60)])
def test_prompts_have_exactly_the_asked_token_count(
    tok: LocalTokenizer, n_tokens: int, how_many: int
) -> None:
    prompts = PromptMaker(tok, seed=1).make_prompts([n_tokens] * how_many, random.Random(2))
    assert _counts(tok, prompts) == [n_tokens] * how_many
    assert all(p == p.strip() for p in prompts)
    # Random slices: almost all distinct (a 1-token prompt has few possible texts).
    assert len(set(prompts)) > how_many // 2


def test_long_prompts_are_exact_and_grow_the_corpus(tok: LocalTokenizer) -> None:
    maker = PromptMaker(tok, seed=3, min_corpus_tokens=2_000)
    prompts = maker.make_prompts([4000] * 10 + [1, 2, 3], random.Random(0))
    assert _counts(tok, prompts) == [4000] * 10 + [1, 2, 3]


def test_prefixed_prompts_keep_the_prefix_tokens(tok: LocalTokenizer) -> None:
    maker = PromptMaker(tok, seed=4)
    rng = random.Random(4)
    prefix = maker.make_prompt(50, rng)
    prompts = maker.make_prompts([30] * 40 + [0], rng, prefixes=[prefix] * 41)
    prefix_ids = tok.encode(prefix)
    for prompt in prompts[:40]:
        ids = tok.encode(prompt)
        assert len(ids) == 80
        assert ids[:50] == prefix_ids
    assert prompts[40] == prefix


def test_same_seed_same_prompts_other_seed_other(tok: LocalTokenizer) -> None:
    def make(corpus_seed: int, rng_seed: int) -> list[str]:
        return PromptMaker(tok, seed=corpus_seed).make_prompts([64] * 30, random.Random(rng_seed))

    assert make(5, 6) == make(5, 6)
    assert set(make(5, 6)).isdisjoint(make(7, 6))
    assert set(make(5, 6)).isdisjoint(make(5, 8))


def test_zero_or_negative_length_is_refused(tok: LocalTokenizer) -> None:
    maker = PromptMaker(tok, seed=0)
    for n in (0, -3):
        with pytest.raises(ConfigError, match="--input-tokens must be at least 1"):
            maker.make_prompt(n, random.Random(0))


class _EvenOnly:
    """A tokenizer that pads every encoding to an even length: no 5-token text exists."""

    name = "even-only"

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_batch([ids])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [[ord(c) for c in text] + [0] * (len(text) % 2) for text in texts]

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return ["".join(chr(i) for i in one if i) for one in ids]

    def count_chat(self, messages: Sequence[Mapping[str, str]]) -> int | None:
        return None


def test_a_tokenizer_that_never_fits_gives_up_with_a_clear_error() -> None:
    maker = PromptMaker(_EvenOnly(), seed=0, min_corpus_tokens=1_000)
    with pytest.raises(ConfigError, match=f"exactly 5 tokens .* even-only after {MAX_SLICES}"):
        maker.make_prompt(5, random.Random(0))


# --- workload kinds ------------------------------------------------------------------------


def test_random_workload(tok: LocalTokenizer) -> None:
    spec = WorkloadSpec(input_tokens=100, output_tokens=20, seed=1)
    requests = build_workload(spec, tok, 50)
    assert [r.index for r in requests] == list(range(50))
    assert _counts(tok, [r.prompt for r in requests]) == [100] * 50
    assert {(r.input_tokens, r.max_tokens) for r in requests} == {(100, 20)}
    assert all(r.at_s is None and r.priority is None and r.session_id is None for r in requests)


def test_workload_is_deterministic_for_a_seed(tok: LocalTokenizer) -> None:
    for kind in (WorkloadKind.MIXED, WorkloadKind.SHARED_PREFIX, WorkloadKind.MULTI_TURN):
        spec = WorkloadSpec(kind=kind, input_tokens=40, output_tokens=10, seed=9)
        first = build_workload(spec, tok, 24)
        assert first == build_workload(spec, tok, 24)
        other = build_workload(WorkloadSpec(kind=kind, input_tokens=40, output_tokens=10), tok, 24)
        assert [r.prompt for r in first] != [r.prompt for r in other]


def test_mixed_has_exactly_the_long_share_at_seeded_places(tok: LocalTokenizer) -> None:
    spec = WorkloadSpec(kind=WorkloadKind.MIXED, input_tokens=30, output_tokens=5, seed=2)
    requests = build_workload(spec, tok, 200)
    lengths = [r.input_tokens for r in requests]
    assert collections.Counter(lengths) == {30: 160, 120: 40}
    assert _counts(tok, [r.prompt for r in requests]) == lengths
    # Spread out, not all at the end.
    assert 0 < lengths.index(120) < 50
    custom = WorkloadSpec(
        kind=WorkloadKind.MIXED, input_tokens=30, long_input_tokens=77, long_fraction=0.5
    )
    assert collections.Counter(r.input_tokens for r in build_workload(custom, tok, 10)) == {
        30: 5,
        77: 5,
    }


def test_shared_prefix_requests_share_exactly_the_prefix(tok: LocalTokenizer) -> None:
    spec = WorkloadSpec(
        kind=WorkloadKind.SHARED_PREFIX, input_tokens=96, prefix_tokens=64, num_prefixes=4
    )
    requests = build_workload(spec, tok, 40)
    ids = {r.index: tok.encode(r.prompt) for r in requests}
    assert all(len(ids[r.index]) == 96 == r.input_tokens for r in requests)
    groups: dict[int | None, list[RequestSpec]] = collections.defaultdict(list)
    for r in requests:
        groups[r.prefix_group].append(r)
    assert set(groups) == {0, 1, 2, 3}
    assert all(len(members) == 10 for members in groups.values())
    prefixes = {g: ids[members[0].index][:64] for g, members in groups.items()}
    assert len({tuple(p) for p in prefixes.values()}) == 4
    for g, members in groups.items():
        assert all(ids[r.index][:64] == prefixes[g] for r in members)
        suffixes = {tuple(ids[r.index][64:]) for r in members}
        assert len(suffixes) == len(members)
        # They part right after the prefix: the first suffix tokens are not all the same.
        assert len({ids[r.index][64] for r in members}) > 1


def test_shared_prefix_default_is_three_quarters_of_the_prompt() -> None:
    spec = WorkloadSpec(kind=WorkloadKind.SHARED_PREFIX, input_tokens=200)
    assert describe(spec)["prefix_tokens"] == 150


def test_multi_turn_histories_grow_turn_by_turn(tok: LocalTokenizer) -> None:
    spec = WorkloadSpec(
        kind=WorkloadKind.MULTI_TURN, input_tokens=20, output_tokens=12, turns=3, seed=4
    )
    requests = build_workload(spec, tok, 9)
    by_session: dict[str | None, list[RequestSpec]] = collections.defaultdict(list)
    for r in requests:
        by_session[r.session_id].append(r)
    assert len(by_session) == 3 and None not in by_session
    # Turn-major within the wave: all first turns, then all second turns.
    assert [len(r.history) for r in requests] == [0, 0, 0, 2, 2, 2, 4, 4, 4]
    for turns in by_session.values():
        for earlier, later in itertools.pairwise(turns):
            grown = (*earlier.history, ("user", earlier.prompt))
            assert later.history[: len(grown)] == grown
            assert later.history[len(grown)][0] == "assistant"
    for r in requests:
        assert len(tok.encode(r.prompt)) == 20 == r.input_tokens
        roles = [role for role, _ in r.history]
        assert roles == ["user", "assistant"] * (len(r.history) // 2)
        replies = [text for role, text in r.history if role == "assistant"]
        assert _counts(tok, replies) == [12] * len(replies)


def test_multi_turn_interleaves_waves_of_active_sessions(tok: LocalTokenizer) -> None:
    spec = WorkloadSpec(
        kind=WorkloadKind.MULTI_TURN, input_tokens=5, output_tokens=3, turns=2, active_sessions=2
    )
    requests = build_workload(spec, tok, 7)
    order = [(r.session_id, len(r.history) // 2) for r in requests]
    a, b, c, d = (f"conv-0-{i}" for i in range(4))
    assert order == [(a, 0), (b, 0), (a, 1), (b, 1), (c, 0), (d, 0), (c, 1)]


def test_priority_mix_is_drawn_per_request_and_leaves_prompts_alone(tok: LocalTokenizer) -> None:
    plain = WorkloadSpec(input_tokens=4, output_tokens=2, seed=3)
    mixed = WorkloadSpec(
        input_tokens=4, output_tokens=2, seed=3, priority_mix={0: 0.2, 1: 0.6, 2: 0.2}
    )
    with_mix = build_workload(mixed, tok, 2000)
    assert [r.prompt for r in with_mix] == [r.prompt for r in build_workload(plain, tok, 2000)]
    counts = collections.Counter(r.priority for r in with_mix)
    assert set(counts) == {0, 1, 2}
    # Binomial SD at n=2000 is ~1%; 3% is far out.
    assert counts[0] / 2000 == pytest.approx(0.2, abs=0.03)
    assert counts[1] / 2000 == pytest.approx(0.6, abs=0.03)
    assert with_mix == build_workload(mixed, tok, 2000)


def test_sessions_spread_requests_over_session_ids(tok: LocalTokenizer) -> None:
    spec = WorkloadSpec(input_tokens=4, output_tokens=2, sessions=5)
    ids = {r.session_id for r in build_workload(spec, tok, 100)}
    assert ids == {f"sess-0-{i}" for i in range(5)}


# --- traces --------------------------------------------------------------------------------


def _write(tmp_path: Path, lines: Sequence[str]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _trace_spec(path: Path, **kwargs: Any) -> WorkloadSpec:
    return WorkloadSpec(kind=WorkloadKind.TRACE, trace_path=path, **kwargs)


def test_trace_replays_lengths_times_groups_and_priorities(
    tok: LocalTokenizer, tmp_path: Path
) -> None:
    path = _write(
        tmp_path,
        [
            '{"timestamp": 100.0, "input_tokens": 50, "output_tokens": 7, "prefix_group": 1}',
            "",
            '{"timestamp": 100.5, "input_tokens": 20, "output_tokens": 3, "priority": 0}',
            '{"timestamp": 102.25, "input_tokens": 40, "output_tokens": 9, "prefix_group": 1,'
            ' "priority": 2, "hash_ids": [1, 2]}',
            '{"timestamp": 102.25, "input_tokens": 8, "output_tokens": 1, "prefix_group": 2}',
        ],
    )
    requests = build_workload(_trace_spec(path, prefix_tokens=32), tok, 100)
    assert [r.at_s for r in requests] == [0.0, 0.5, 2.25, 2.25]
    assert [r.input_tokens for r in requests] == [50, 20, 40, 8]
    assert _counts(tok, [r.prompt for r in requests]) == [50, 20, 40, 8]
    assert [r.max_tokens for r in requests] == [7, 3, 9, 1]
    assert [r.priority for r in requests] == [None, 0, 2, None]
    assert [r.prefix_group for r in requests] == [1, None, 1, 2]
    first, _, third, fourth = (tok.encode(r.prompt) for r in requests)
    assert first[:32] == third[:32] and first[32:] != third[32:]
    # Group 2's only request is shorter than --prefix-tokens: the prefix is the whole prompt.
    assert len(fourth) == 8
    # --requests cuts the trace short; the trace's priorities win over a mix.
    mixed = _trace_spec(path, priority_mix={1: 1.0})
    assert [r.priority for r in build_workload(mixed, tok, 3)] == [1, 0, 2]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r":2: not valid JSON"),
        ("[1, 2]", r":2: expected a JSON object, got list"),
        ('{"input_tokens": 5, "output_tokens": 5}', r":2: missing field 'timestamp'"),
        ('{"timestamp": 3, "output_tokens": 5}', r":2: missing field 'input_tokens'"),
        ('{"timestamp": 3, "input_tokens": 5}', r":2: missing field 'output_tokens'"),
        ('{"timestamp": "3", "input_tokens": 5, "output_tokens": 5}', r"'timestamp' must be"),
        ('{"timestamp": true, "input_tokens": 5, "output_tokens": 5}', r"'timestamp' must be"),
        ('{"timestamp": 3, "input_tokens": 0, "output_tokens": 5}', r"'input_tokens' must be"),
        ('{"timestamp": 3, "input_tokens": 2.5, "output_tokens": 5}', r"'input_tokens' must be"),
        ('{"timestamp": 3, "input_tokens": 5, "output_tokens": -1}', r"'output_tokens' must be"),
        ('{"timestamp": 3, "input_tokens": 5, "output_tokens": 5, "priority": 3}', "'priority'"),
        ('{"timestamp": 3, "input_tokens": 5, "output_tokens": 5, "priority": "0"}', "'priority'"),
        ('{"timestamp": 3, "input_tokens": 5, "output_tokens": 5, "tenant": ""}', "'tenant'"),
        ('{"timestamp": 3, "input_tokens": 5, "output_tokens": 5, "tenant": 7}', "'tenant'"),
        (
            '{"timestamp": 3, "input_tokens": 5, "output_tokens": 5, "prefix_group": -1}',
            "'prefix_group' must be an integer >= 0",
        ),
        ('{"timestamp": 0.5, "input_tokens": 5, "output_tokens": 5}', r"'timestamp' goes back"),
    ],
)
def test_each_bad_trace_line_names_file_line_and_field(
    tmp_path: Path, line: str, message: str
) -> None:
    path = _write(tmp_path, ['{"timestamp": 1, "input_tokens": 5, "output_tokens": 5}', line])
    with pytest.raises(ConfigError, match=message) as caught:
        load_trace(path)
    assert f"{path}:2:" in str(caught.value)


def test_missing_or_empty_trace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--trace .*no such file"):
        load_trace(tmp_path / "absent.jsonl")
    with pytest.raises(ConfigError, match="holds no requests"):
        load_trace(_write(tmp_path, ["", "  "]))


# --- specs and descriptions ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"input_tokens": 0}, "--input-tokens"),
        ({"output_tokens": 0}, "--output-tokens"),
        ({"long_fraction": 1.5}, "--long-fraction"),
        ({"long_input_tokens": 0}, "--long-input-tokens"),
        ({"num_prefixes": 0}, "--num-prefixes"),
        ({"prefix_tokens": 0}, "--prefix-tokens"),
        ({"kind": WorkloadKind.SHARED_PREFIX, "prefix_tokens": 512}, "--prefix-tokens"),
        ({"turns": 0}, "--turns"),
        ({"active_sessions": 0}, "--active-sessions"),
        ({"kind": WorkloadKind.TRACE}, "--trace"),
        ({"priority_mix": {3: 1.0}}, "--priority-mix"),
        ({"priority_mix": {0: -1.0}}, "--priority-mix"),
        ({"priority_mix": {0: 0.0}}, "--priority-mix"),
        ({"sessions": 0}, "--sessions"),
        ({"kind": WorkloadKind.MULTI_TURN, "sessions": 4}, "--sessions"),
    ],
)
def test_bad_spec_names_the_flag(kwargs: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        WorkloadSpec(**kwargs)


def test_negative_count_is_refused(tok: LocalTokenizer) -> None:
    with pytest.raises(ConfigError, match="--requests"):
        build_workload(WorkloadSpec(), tok, -1)


def test_parse_priority_mix() -> None:
    assert parse_priority_mix("0=0.2,1=0.6,2=0.2") == {0: 0.2, 1: 0.6, 2: 0.2}
    for bad in ("0:1", "x=1", "0=y", "5=1", ""):
        with pytest.raises(ConfigError, match="--priority-mix"):
            parse_priority_mix(bad)


def test_describe_is_json_and_names_what_shaped_each_kind(tmp_path: Path) -> None:
    specs = {
        WorkloadKind.RANDOM: WorkloadSpec(priority_mix={0: 1.0, 2: 3.0}, sessions=3),
        WorkloadKind.MIXED: WorkloadSpec(kind=WorkloadKind.MIXED, input_tokens=10),
        WorkloadKind.SHARED_PREFIX: WorkloadSpec(kind=WorkloadKind.SHARED_PREFIX),
        WorkloadKind.MULTI_TURN: WorkloadSpec(kind=WorkloadKind.MULTI_TURN, turns=6),
        WorkloadKind.TRACE: _trace_spec(tmp_path / "t.jsonl"),
    }
    described = {kind: json.loads(json.dumps(describe(s))) for kind, s in specs.items()}
    assert described[WorkloadKind.RANDOM] == {
        "kind": "random",
        "seed": 0,
        "input_tokens": 512,
        "output_tokens": 128,
        "priority_mix": {"0": 1.0, "2": 3.0},
        "sessions": 3,
    }
    assert described[WorkloadKind.MIXED]["long_input_tokens"] == 40
    assert described[WorkloadKind.SHARED_PREFIX]["num_prefixes"] == 8
    assert described[WorkloadKind.MULTI_TURN]["turns"] == 6
    assert described[WorkloadKind.TRACE]["trace"].endswith("t.jsonl")
    assert "input_tokens" not in described[WorkloadKind.TRACE]


# --- the server tokenizer, against a fake vLLM /tokenize -----------------------------------


@pytest.fixture
def fake_vllm(tok: LocalTokenizer) -> Iterator[str]:
    """A /tokenize + /detokenize server shaped like vLLM's, on a thread of its own."""

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        assert body["add_special_tokens"] is False and body["model"] == "smollm2"
        ids = tok.encode(body["prompt"])
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": 8192})

    async def detokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": tok.decode(body["tokens"])})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    yield from _serve(app)


def _serve(app: web.Application) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_server_tokenizer_builds_exact_prompts(tok: LocalTokenizer, fake_vllm: str) -> None:
    server = ServerTokenizer(fake_vllm + "/v1/", "smollm2")
    assert server.name == f"{fake_vllm}/tokenize (smollm2)"
    prompts = PromptMaker(server, seed=1).make_prompts([100] * 30, random.Random(1))
    assert _counts(tok, prompts) == [100] * 30
    # Same tokenizer, same seed: the same prompts as with the local copy.
    assert prompts == PromptMaker(tok, seed=1).make_prompts([100] * 30, random.Random(1))


def test_server_tokenizer_works_inside_a_running_event_loop(fake_vllm: str) -> None:
    async def inside() -> list[int]:
        return ServerTokenizer(fake_vllm, "smollm2").encode("hello world")

    assert len(asyncio.run(inside())) == 2


@pytest.mark.parametrize(
    ("status", "body"), [(404, "{}"), (500, "{}"), (200, '{"oops": 1}'), (200, "not json")]
)
def test_a_target_without_tokenize_points_to_the_tokenizer_flag(status: int, body: str) -> None:
    for url in _serve(_answering(body, status)):
        with pytest.raises(ConfigError, match="--url: POST") as caught:
            ServerTokenizer(url, "m").encode("hi")
        assert "--tokenizer PATH" in str(caught.value)


def _answering(body: str, status: int) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body, status=status, content_type="application/json")

    app = web.Application()
    app.router.add_post("/tokenize", handler)
    return app


def test_unreachable_target_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("--url: cannot connect to http://127.0.0.1:9/tokenize")
    ):
        ServerTokenizer("http://127.0.0.1:9", "m", timeout_s=5).encode("hi")


def test_open_tokenizer_picks_local_when_a_path_is_given(tmp_path: Path) -> None:
    assert isinstance(open_tokenizer("http://x", "m", None), ServerTokenizer)
    with pytest.raises(ConfigError, match=r"--tokenizer .*no such folder"):
        open_tokenizer("http://x", "m", tmp_path / "absent")
    with pytest.raises(ConfigError, match=r"--tokenizer .*cannot load a tokenizer"):
        open_tokenizer("http://x", "m", tmp_path)
