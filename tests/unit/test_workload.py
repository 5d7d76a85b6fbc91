"""Workloads: their kinds, traces and specs, checked with the embedded model's real tokenizer
(its exact-length prompts: test_workload_prompts.py).

The tokenizer is SmolLM2's, loaded from the converted model folder (`make model`).
"""

from __future__ import annotations

import collections
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from servepilot.bench.records import RequestSpec
from servepilot.bench.tokenizer import LocalTokenizer
from servepilot.bench.workload import build_workload
from servepilot.core.errors import ConfigError
from servepilot.load.trace import load_trace
from servepilot.load.workload import WorkloadKind, WorkloadSpec, describe, parse_priority_mix
from tests.unit.tokenizer_support import token_counts

# --- workload kinds ------------------------------------------------------------------------


def test_random_workload(tok: LocalTokenizer) -> None:
    spec = WorkloadSpec(input_tokens=100, output_tokens=20, seed=1)
    requests = build_workload(spec, tok, 50)
    assert [r.index for r in requests] == list(range(50))
    assert token_counts(tok, [r.prompt for r in requests]) == [100] * 50
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
    assert token_counts(tok, [r.prompt for r in requests]) == lengths
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
        assert token_counts(tok, replies) == [12] * len(replies)


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
    assert token_counts(tok, [r.prompt for r in requests]) == [50, 20, 40, 8]
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
