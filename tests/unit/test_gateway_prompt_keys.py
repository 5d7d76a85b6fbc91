"""A prompt's keys for the exact prefix index (its token count and vLLM's block hashes),
computed by pieces and shared between prompts that begin alike, equal those of the whole
prompt tokenised and hashed from nothing."""

from __future__ import annotations

from typing import Any

import pytest

from servepilot.engine.model_source import embedded_model_dir
from servepilot.gateway.tokens import PieceChains, PromptBlocks, PromptKeys, PromptTokenizer
from servepilot.routing.kv_index import BlockHashing, prompt_block_hashes

PIECES = {"a": list(range(1, 11)), "b": list(range(11, 17)), "c": [17, 18, 19], "d": [20]}


def _whole(pieces: list[str], hashing: BlockHashing) -> PromptKeys:
    ids = [token for piece in pieces for token in PIECES[piece]]
    return PromptKeys(len(ids), tuple(prompt_block_hashes(ids, hashing)))


def test_pieces_hash_as_the_whole_prompt() -> None:
    """Blocks that span pieces, a prompt ending on a block's last token (that block is not
    reusable: vLLM computes the last token), prompts that branch after a shared piece."""
    hashing = BlockHashing(block_size=4)
    chains = PieceChains(hashing, max_chars=1_000)
    for pieces in (["a"], ["a", "b"], ["a", "b", "c"], ["a", "c"], ["b", "a", "d"], ["d"]):
        assert chains.keys(pieces, PIECES.__getitem__) == _whole(pieces, hashing), pieces
    assert chains.keys(["a", "b"], PIECES.__getitem__).tokens == 16
    assert len(chains.keys(["a", "b"], PIECES.__getitem__).block_hashes) == 3  # not 4


class _Tokenizer:
    """PIECES' ids, noting which pieces were asked for (tokenised)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, piece: str) -> list[int]:
        self.asked.append(piece)
        return PIECES[piece]


def test_a_prompt_that_extends_another_tokenises_only_what_it_adds() -> None:
    ids_of = _Tokenizer()
    chains = PieceChains(BlockHashing(block_size=4), max_chars=1_000)
    chains.keys(["a", "b"], ids_of)
    chains.keys(["a", "b", "c"], ids_of)
    chains.keys(["a", "b", "c", "d"], ids_of)
    assert ids_of.asked == ["a", "b", "c", "d"]


def test_past_its_bound_the_tree_starts_again_and_keys_stay_right() -> None:
    ids_of = _Tokenizer()
    hashing = BlockHashing(block_size=4)
    chains = PieceChains(hashing, max_chars=2)  # a, b: 2 characters of pieces
    assert chains.keys(["a", "b"], ids_of) == _whole(["a", "b"], hashing)
    assert chains.keys(["a", "b", "c"], ids_of) == _whole(["a", "b", "c"], hashing)
    assert chains.keys(["a", "b"], ids_of) == _whole(["a", "b"], hashing)
    assert ids_of.asked == ["a", "b", "c", "a", "b"]  # 3 characters held: began anew


def _conversation(turns: int, system: str, seed: int) -> list[dict[str, Any]]:
    """Chat bodies of one session, each turn repeating the history before it."""
    messages = [{"role": "system", "content": system}]
    bodies = []
    for turn in range(turns):
        words = " ".join(f"w{seed}x{turn}x{i}" for i in range(40 + 13 * turn))
        messages = [*messages, {"role": "user", "content": f"question {turn}: {words}"}]
        bodies.append({"model": "m", "messages": messages})
        messages = [*messages, {"role": "assistant", "content": f"answer {turn}, {words[:90]}"}]
    return bodies


@pytest.mark.parametrize("block_size", [16, 128])
def test_a_conversations_keys_equal_its_whole_prompts_tokenised(block_size: int) -> None:
    """Two sessions sharing a system prompt, turn after turn through one PromptBlocks (as the
    gateway keys them), against each rendered prompt tokenised whole and hashed from nothing."""
    folder = embedded_model_dir()
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the embedded model is not converted here (servepilot models pull)")
    # The reference is transformers' own rendering and tokenising, as vLLM's API server runs
    # them (the gateway reads the same files without transformers).
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    hashing = BlockHashing(block_size=block_size)
    blocks = PromptBlocks(PromptTokenizer(folder), hashing)
    system = "You are a careful assistant. " * 30
    sessions = zip(_conversation(8, system, 1), _conversation(8, system, 2), strict=True)
    try:
        for one, other in sessions:
            for body in (one, other):
                text = hf.apply_chat_template(
                    body["messages"], tokenize=False, add_generation_prompt=True
                )
                assert blocks.tokenizer.rendered(body["messages"]) == text
                ids = hf(text, add_special_tokens=False).input_ids
                expected = PromptKeys(len(ids), tuple(prompt_block_hashes(ids, hashing)))
                assert blocks.keys(body) == expected
                assert blocks.tokenizer.body_ids(body) == ids
    finally:
        blocks.close()


def test_new_chars_are_those_past_what_the_chains_hold() -> None:
    chains = PieceChains(BlockHashing(block_size=4), max_chars=1_000)
    assert chains.new_chars(["a", "b"]) == 2
    chains.keys(["a", "b"], PIECES.__getitem__)
    assert chains.new_chars(["a", "b", "c"]) == 1
    assert chains.new_chars(["b", "a"]) == 2  # held, but not from the start


def test_a_short_new_turn_is_keyed_on_the_loop_a_long_one_on_the_thread() -> None:
    """The same keys either way; the long prompt's pieces are tokenised on the tokenizer's
    thread, the next turn's few new ones on the event loop."""
    import asyncio
    import threading

    folder = embedded_model_dir()
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the embedded model is not converted here (servepilot models pull)")
    hashing = BlockHashing(block_size=16)
    blocks = PromptBlocks(PromptTokenizer(folder), hashing)
    reference = PromptBlocks(PromptTokenizer(folder), hashing)
    threads: list[str] = []
    piece_ids = blocks.tokenizer.piece_ids

    def noted(piece: str) -> list[int]:
        threads.append(threading.current_thread().name)
        return piece_ids(piece)

    blocks.tokenizer.piece_ids = noted  # type: ignore[method-assign]
    long_system = "You are a careful assistant who reads every word. " * 100  # 5,100 chars
    first, second = _conversation(2, long_system, 3)

    async def both() -> tuple[PromptKeys | None, PromptKeys | None]:
        return await blocks.keys_async(first), await blocks.keys_async(second)

    try:
        keys = asyncio.run(both())
        assert keys == (reference.keys(first), reference.keys(second))
        on_thread = [name for name in threads if name.startswith("servepilot-tokens")]
        assert on_thread and len(on_thread) < len(threads)
        assert threads[-1] == "MainThread"  # the second turn's new pieces
    finally:
        blocks.close()
        reference.close()
