"""Exact-length prompts, checked with the embedded model's real tokenizer, local and behind a
server.

The tokenizer is SmolLM2's, loaded from the converted model folder (`make model`); the
server-tokenizer path is exercised against a small fake /tokenize server backed by it.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from aiohttp import web

from servepilot.bench.prompts import MAX_SLICES, PromptMaker
from servepilot.bench.tokenizer import LocalTokenizer, ServerTokenizer, open_tokenizer
from servepilot.core.errors import ConfigError
from tests.unit.http_thread import serving_app
from tests.unit.tokenizer_support import token_counts

# --- exact prompts -------------------------------------------------------------------------


@pytest.mark.parametrize(("n_tokens", "how_many"), [(1, 200), (7, 200), (128, 200), (1000, 60)])
def test_prompts_have_exactly_the_asked_token_count(
    tok: LocalTokenizer, n_tokens: int, how_many: int
) -> None:
    prompts = PromptMaker(tok, seed=1).make_prompts([n_tokens] * how_many, random.Random(2))
    assert token_counts(tok, prompts) == [n_tokens] * how_many
    assert all(p == p.strip() for p in prompts)
    # Random slices: almost all distinct (a 1-token prompt has few possible texts).
    assert len(set(prompts)) > how_many // 2


def test_long_prompts_are_exact_and_grow_the_corpus(tok: LocalTokenizer) -> None:
    maker = PromptMaker(tok, seed=3, min_corpus_tokens=2_000)
    prompts = maker.make_prompts([4000] * 10 + [1, 2, 3], random.Random(0))
    assert token_counts(tok, prompts) == [4000] * 10 + [1, 2, 3]


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
    with serving_app(app) as url:
        yield url


def test_server_tokenizer_builds_exact_prompts(tok: LocalTokenizer, fake_vllm: str) -> None:
    server = ServerTokenizer(fake_vllm + "/v1/", "smollm2")
    assert server.name == f"{fake_vllm}/tokenize (smollm2)"
    prompts = PromptMaker(server, seed=1).make_prompts([100] * 30, random.Random(1))
    assert token_counts(tok, prompts) == [100] * 30
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
    with serving_app(_answering(body, status)) as url:
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
