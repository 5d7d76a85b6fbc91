"""Prefix text and hashes, and prefix-affinity routing: known answers on scripted traffic."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pytest

from servepilot.core.config import RoutingConfig
from servepilot.routing import PrefixAffinity
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.routing.prefix import prefix_hashes, prompt_text

BLOCK = 16
CONFIG = RoutingConfig(prefix_block_chars=BLOCK, prefix_max_blocks=64)


def chat(*contents: str) -> dict[str, Any]:
    roles = ["system", "user", "assistant"]
    messages = [
        {"role": roles[0] if i == 0 else roles[1 + (i - 1) % 2], "content": content}
        for i, content in enumerate(contents)
    ]
    return {"model": "m", "messages": messages}


def common_run(a: Sequence[object], b: Sequence[object]) -> int:
    """Length of the common leading run (of hashes, or of characters)."""
    count = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        count += 1
    return count


def views(*loads: int) -> list[ReplicaView]:
    return [ReplicaView(replica_id=f"r{i}", in_flight=load) for i, load in enumerate(loads)]


def request(text: str, config: RoutingConfig = CONFIG) -> RequestView:
    hashes = prefix_hashes(text, config.prefix_block_chars, config.prefix_max_blocks)
    return RequestView(model="m", prompt_chars=len(text), prefix_hashes=hashes)


def text_of(seed: int, chars: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(chars))


# --- prefix_hashes -------------------------------------------------------------------------


def test_equal_prefixes_share_hashes_until_the_first_differing_block() -> None:
    base = text_of(1, 1000)
    changed = base[:600] + "#" + base[601:]  # char 600 is in block 6 of 100 chars
    a, b = prefix_hashes(base, 100, 64), prefix_hashes(changed, 100, 64)
    assert len(a) == len(b) == 10
    assert a[:6] == b[:6]
    # Chained: every block from the first difference on differs, though blocks 7.. are equal.
    assert all(x != y for x, y in zip(a[6:], b[6:], strict=True))


def test_partial_trailing_block_is_not_hashed() -> None:
    text = text_of(2, 250)
    hashes = prefix_hashes(text, 100, 64)
    assert len(hashes) == 2
    assert prefix_hashes(text + "x" * 49, 100, 64) == hashes
    assert prefix_hashes(text + "x" * 50, 100, 64)[:2] == hashes
    assert len(prefix_hashes(text + "x" * 50, 100, 64)) == 3
    assert prefix_hashes("short", 100, 64) == ()


def test_max_blocks_caps_the_hashes() -> None:
    text = text_of(3, 10_000)
    assert len(prefix_hashes(text, 100, 7)) == 7
    assert prefix_hashes(text, 100, 7) == prefix_hashes(text, 100, 64)[:7]


def test_hashes_are_chained_not_per_block() -> None:
    # The same block content at different positions must not look like the same prefix.
    hashes = prefix_hashes("a" * 64, BLOCK, 64)
    assert len(set(hashes)) == 4


def test_degenerate_block_parameters_hash_nothing() -> None:
    assert prefix_hashes("x" * 100, 0, 64) == ()
    assert prefix_hashes("x" * 100, 16, 0) == ()


# --- prompt_text ---------------------------------------------------------------------------


def test_chat_history_is_a_prefix_of_its_continuation() -> None:
    system = text_of(10, 300)
    history = chat(system, text_of(11, 200), text_of(12, 400))
    follow_a = chat(system, text_of(11, 200), text_of(12, 400), "what about " + text_of(13, 300))
    follow_b = chat(system, text_of(11, 200), text_of(12, 400), "and then " + text_of(14, 300))
    history_text = prompt_text(history)
    assert prompt_text(follow_a).startswith(history_text)
    assert prompt_text(follow_b).startswith(history_text)
    history_blocks = len(prefix_hashes(history_text, BLOCK, 1000))
    a = prefix_hashes(prompt_text(follow_a), BLOCK, 1000)
    b = prefix_hashes(prompt_text(follow_b), BLOCK, 1000)
    assert a[:history_blocks] == b[:history_blocks] == prefix_hashes(history_text, BLOCK, 1000)
    # They diverge inside the last message, right where the texts first differ.
    common = common_run(prompt_text(follow_a), prompt_text(follow_b))
    assert common_run(a, b) == common // BLOCK
    assert common < len(history_text) + 10


def test_conversations_sharing_only_the_first_message_diverge_after_it() -> None:
    system = text_of(20, 500)
    a_text = prompt_text(chat(system, "Alpha " + text_of(21, 500)))
    b_text = prompt_text(chat(system, "Beta " + text_of(22, 500)))
    first = prompt_text(chat(system))
    a, b = prefix_hashes(a_text, BLOCK, 1000), prefix_hashes(b_text, BLOCK, 1000)
    shared = common_run(a, b)
    # The system message (and the next role) is shared, the differing content is not.
    assert shared == common_run(a_text, b_text) // BLOCK
    assert len(first) // BLOCK <= shared <= (len(first) + len("user") + 1) // BLOCK + 1
    assert shared < len(a) and shared < len(b)


def test_chat_roles_and_message_boundaries_change_the_text() -> None:
    as_user = {"messages": [{"role": "user", "content": "hello"}]}
    as_system = {"messages": [{"role": "system", "content": "hello"}]}
    assert prompt_text(as_user) != prompt_text(as_system)
    split_1 = {"messages": [{"role": "user", "content": "ab"}, {"role": "user", "content": "c"}]}
    split_2 = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "bc"}]}
    assert prompt_text(split_1) != prompt_text(split_2)


def test_multipart_content_keeps_text_and_marks_other_parts() -> None:
    def with_image(url: str) -> dict[str, Any]:
        parts = [
            {"type": "text", "text": "look at"},
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "this picture"},
        ]
        return {"messages": [{"role": "user", "content": parts}]}

    text = prompt_text(with_image("data:image/png;base64,AAAA"))
    assert "look at" in text and "this picture" in text
    assert "base64" not in text
    assert text.index("look at") < text.index("image_url") < text.index("this picture")
    # Image bytes are not hashed: the same text around another image renders alike.
    assert prompt_text(with_image("https://example.com/other.png")) == text
    text_only = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look at"},
                    {"type": "text", "text": "this picture"},
                ],
            }
        ]
    }
    assert prompt_text(text_only) != text


def test_assistant_tool_calls_are_part_of_the_history() -> None:
    def turn(arguments: str) -> dict[str, Any]:
        call = {"type": "function", "function": {"name": "search", "arguments": arguments}}
        return {"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]}

    assert "search" in prompt_text(turn('{"q": "a"}'))
    assert prompt_text(turn('{"q": "a"}')) != prompt_text(turn('{"q": "b"}'))


def test_completion_prompts() -> None:
    assert prompt_text({"prompt": "once upon a time"}) == "once upon a time"
    joined = prompt_text({"prompt": ["first", "second"]})
    assert joined.startswith("first") and "second" in joined
    nested = prompt_text({"prompt": [["x", 1], "tail"]})
    assert "x" in nested and nested.endswith("tail\x1e")


def test_token_id_prompts_render_four_characters_per_token() -> None:
    ids = list(range(1000, 1200))
    text = prompt_text({"prompt": ids})
    assert len(text) == 4 * len(ids)
    assert prompt_text({"prompt": [*ids[:100], 5, 6]}).startswith(text[:400])
    assert prompt_text({"prompt": [1, 2]}) != prompt_text({"prompt": [12]})
    # Equal leading token runs give equal leading hashes: 16 chars are 4 tokens per block.
    a = prefix_hashes(prompt_text({"prompt": [*ids[:40], 1]}), BLOCK, 64)
    b = prefix_hashes(prompt_text({"prompt": [*ids[:40], 2, 3, 4, 5]}), BLOCK, 64)
    assert common_run(a, b) == 10
    batch = prompt_text({"prompt": [ids[:8], ids[8:12]]})
    assert batch.startswith(text[:32])
    # Ids that do not fit four bytes fall back to decimal rather than failing.
    assert prompt_text({"prompt": [-1, 2**40]}) == f"-1,{2**40}"


def test_max_chars_truncates_to_the_same_leading_text() -> None:
    long_chat = chat(*(text_of(i, 400) for i in range(50)))
    assert prompt_text(long_chat, max_chars=1000) == prompt_text(long_chat)[:1000]
    tokens = {"prompt": list(range(100_000))}
    assert prompt_text(tokens, max_chars=50) == prompt_text(tokens)[:50]
    batch = {"prompt": [text_of(i, 300) for i in range(20)]}
    assert prompt_text(batch, max_chars=700) == prompt_text(batch)[:700]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": None},
        {"messages": "not a list"},
        {"messages": []},
        {"messages": [None, 3, "text", {"role": None, "content": None}, {"content": 5}]},
        {"messages": [{"role": "user", "content": [None, 7, {"type": "text"}, {"type": 3}]}]},
        {"messages": [{"role": "assistant", "tool_calls": [None, {"function": "x"}, 4]}]},
        {"messages": [{"role": "user", "content": {"nested": "dict"}}]},
        {"prompt": None},
        {"prompt": 12},
        {"prompt": [1, "a", None, [2, 3], {"x": 1}, 2.5]},
        {"prompt": []},
        {"prompt": [10**5000]},  # str() of a huge int raises in Python 3.11+
    ],
)
def test_odd_shapes_never_raise(body: dict[str, Any]) -> None:
    text = prompt_text(body)
    assert isinstance(text, str)
    prefix_hashes(text, BLOCK, 64)


# --- PrefixAffinity ------------------------------------------------------------------------


def test_requests_sharing_a_prefix_stick_to_one_replica_while_loads_are_equal() -> None:
    policy = PrefixAffinity(CONFIG, random.Random(0))
    candidates = views(0, 0, 0, 0)
    prefixes = [text_of(100 + g, 8 * BLOCK) for g in range(8)]
    landed: dict[int, set[str]] = defaultdict(set)
    rng = random.Random(1)
    for _ in range(400):
        group = rng.randrange(8)
        suffix = text_of(rng.randrange(10**6), rng.randrange(0, 5 * BLOCK))
        landed[group].add(policy.choose(request(prefixes[group] + suffix), candidates))
    assert len(landed) == 8
    assert all(len(replicas) == 1 for replicas in landed.values())
    # The first request of each group went by least load, so the groups are spread out.
    assert len(set().union(*landed.values())) > 1


def test_light_load_keeps_affinity_thanks_to_the_additive_slack() -> None:
    policy = PrefixAffinity(CONFIG, random.Random(0))
    text = text_of(5, 4 * BLOCK)
    owner = policy.choose(request(text), views(0, 0, 0))
    # Mean 1/3: without the +1 the bound would be 0.42 and one request in flight would spill.
    busy = [
        ReplicaView(v.replica_id, in_flight=1 if v.replica_id == owner else 0)
        for v in views(0, 0, 0)
    ]
    assert {policy.choose(request(text), busy) for _ in range(20)} == {owner}


def test_a_holder_above_the_load_bound_is_skipped_for_the_least_loaded() -> None:
    policy = PrefixAffinity(CONFIG, random.Random(0))
    text = text_of(6, 6 * BLOCK)
    assert policy.choose(request(text), [ReplicaView("hot", in_flight=0)]) == "hot"
    # Loads 10, 0, 3: mean 4.33, bound 1.25 x 4.33 + 1 = 6.4, so "hot" is above the line.
    loaded = [
        ReplicaView("hot", in_flight=10),
        ReplicaView("idle", in_flight=0),
        ReplicaView("some", in_flight=3),
    ]
    assert policy.choose(request(text), loaded) == "idle"
    # The prefix now follows the replica it spilled to.
    calm = [ReplicaView(rid, in_flight=0) for rid in ("hot", "idle", "some")]
    assert policy.choose(request(text), calm) == "idle"


def test_spill_never_returns_to_the_overloaded_holder() -> None:
    policy = PrefixAffinity(CONFIG, random.Random(3))
    text = text_of(7, 4 * BLOCK)
    first = policy.choose(request(text), [ReplicaView("hot", in_flight=0)])
    assert first == "hot"
    loaded = [ReplicaView("hot", in_flight=40)] + [
        ReplicaView(f"r{i}", in_flight=i) for i in range(4)
    ]
    for _ in range(200):
        # Keep "hot" as the holder: route once on it alone, then spill from it.
        policy.choose(request(text), [ReplicaView("hot", in_flight=0)])
        assert policy.choose(request(text), loaded) != "hot"


def test_the_next_longest_holder_is_used_when_the_longest_is_not_a_candidate() -> None:
    text = text_of(8, 4 * BLOCK)

    def a_holds_four_b_holds_two() -> PrefixAffinity:
        policy = PrefixAffinity(CONFIG, random.Random(0))
        policy.choose(request(text), [ReplicaView("a", in_flight=0)])
        policy.choose(request(text[: 2 * BLOCK] + "z" * 2 * BLOCK), [ReplicaView("b", in_flight=0)])
        return policy

    everyone = [ReplicaView(rid, in_flight=0) for rid in ("a", "b", "c")]
    assert a_holds_four_b_holds_two().choose(request(text), everyone) == "a"
    policy = a_holds_four_b_holds_two()
    before = policy.stats()["prefix_blocks_matched"]
    without_a = [ReplicaView(rid, in_flight=0) for rid in ("b", "c")]
    assert policy.choose(request(text), without_a) == "b"
    assert policy.stats()["prefix_blocks_matched"] - before == 2


def test_hit_rate_counters_on_a_scripted_sequence() -> None:
    policy = PrefixAffinity(CONFIG, random.Random(0))
    text = text_of(9, 4 * BLOCK)
    only_a = [ReplicaView("a", in_flight=0)]
    policy.choose(request(text), only_a)  # 4 looked up, none known
    policy.choose(request(text), only_a)  # 4 looked up, 4 on a
    policy.choose(request(text[: 2 * BLOCK] + "y" * 2 * BLOCK), only_a)  # 4 looked up, 2 on a
    policy.choose(request("too short"), only_a)  # no full block: nothing looked up
    policy.choose(request(text), [ReplicaView("b", in_flight=0)])  # 4 looked up, none on b
    stats = policy.stats()
    assert stats["prefix_blocks_total"] == 16
    assert stats["prefix_blocks_matched"] == 6
    assert stats["prefix_blocks_matched"] / stats["prefix_blocks_total"] == pytest.approx(0.375)


def test_the_table_is_bounded_and_evicts_deepest_blocks_first() -> None:
    config = RoutingConfig(prefix_block_chars=BLOCK, prefix_table_blocks=6)
    policy = PrefixAffinity(config, random.Random(0))
    only_a = [ReplicaView("a", in_flight=0)]
    first, second = text_of(30, 4 * BLOCK), text_of(31, 4 * BLOCK)
    policy.choose(request(first, config), only_a)
    policy.choose(request(second, config), only_a)
    assert policy.stats()["prefix_table_blocks"] == 6
    # `first`'s two deepest blocks were evicted; its two leading ones are still known.
    policy.choose(request(first, config), only_a)
    assert policy.stats()["prefix_blocks_matched"] == 2
    for seed in range(32, 40):
        policy.choose(request(text_of(seed, 4 * BLOCK), config), only_a)
        assert policy.stats()["prefix_table_blocks"] <= 6


def test_forget_drops_the_replicas_entries() -> None:
    policy = PrefixAffinity(CONFIG, random.Random(0))
    text_a, text_b = text_of(40, 4 * BLOCK), text_of(41, 3 * BLOCK)
    policy.choose(request(text_a), [ReplicaView("a", in_flight=0)])
    policy.choose(request(text_b), [ReplicaView("b", in_flight=0)])
    assert policy.stats()["prefix_table_blocks"] == 7
    policy.forget("a")
    assert policy.stats()["prefix_table_blocks"] == 3
    policy.forget("unknown")
    assert policy.stats()["prefix_table_blocks"] == 3
    # "a" is back in the pool but its prefix is no longer credited to it.
    policy.choose(request(text_a), [ReplicaView("a", in_flight=0)])
    assert policy.stats()["prefix_blocks_matched"] == 0


def test_short_prompts_use_least_load() -> None:
    policy = PrefixAffinity(CONFIG, random.Random(0))
    candidates = [ReplicaView("busy", in_flight=5), ReplicaView("idle", in_flight=0)]
    assert {policy.choose(request("tiny"), candidates) for _ in range(20)} == {"idle"}
    assert policy.stats()["prefix_blocks_total"] == 0


def test_prefix_affinity_is_reproducible_with_a_seed() -> None:
    texts = [text_of(50 + i % 5, 3 * BLOCK) + str(i) for i in range(60)]

    def run(seed: int) -> list[str]:
        policy = PrefixAffinity(CONFIG, random.Random(seed))
        rng = random.Random(99)
        picks = []
        for text in texts:
            loads = [rng.randrange(4) for _ in range(4)]
            picks.append(policy.choose(request(text), views(*loads)))
        return picks

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_prefix_affinity_declares_it_needs_prefix_hashes() -> None:
    policy = PrefixAffinity(CONFIG, random.Random(0))
    assert policy.uses_prefix is True
    assert policy.name == "prefix_affinity"
