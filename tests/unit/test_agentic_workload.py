"""The agentic workload's sessions (load/agentic.py, load/sessions.py): seeded scripts whose
context grows by each answer and a new message, shared system prompts, tool turns and waits
with the stated means, returning sessions, and the turn scheduler's counting."""

from __future__ import annotations

import statistics

import pytest

from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode
from servepilot.load.agentic import AgenticSpec
from servepilot.load.loadplan import LoadPlan
from servepilot.load.sessions import SessionLoop, TurnSlot, session_script
from servepilot.load.shapes import workload_shapes
from servepilot.load.workload import WorkloadKind, WorkloadSpec, describe


def _spec(turns: int = 6, seed: int = 3, **agentic: float) -> WorkloadSpec:
    return WorkloadSpec(
        kind=WorkloadKind.AGENTIC, input_tokens=100, output_tokens=20, seed=seed, turns=turns,
        agentic=AgenticSpec(system_prompt_tokens=500, tool_tokens=40, **agentic),  # type: ignore[arg-type]
    )  # fmt: skip


def test_each_turn_sends_the_previous_prompt_and_answer_plus_its_new_message() -> None:
    script = session_script(_spec(), 7)
    assert len(script.turns) == 6 and script.session_id == "conv-3-7"
    assert script.prompt_tokens(0) == 500 + 100
    for t in range(1, 6):
        new = script.turns[t].new_tokens
        assert new == (40 if script.turns[t].tool else 100)
        assert script.history_tokens(t) == script.prompt_tokens(t - 1) + 20
        assert script.prompt_tokens(t) == script.prompt_tokens(t - 1) + 20 + new
    assert script.turns[0].wait_s == 0.0 and not script.turns[0].tool


def test_a_script_depends_on_the_seed_and_session_only() -> None:
    spec = _spec()
    assert session_script(spec, 5) == session_script(spec, 5)
    assert session_script(spec, 5) != session_script(spec, 6)
    assert session_script(spec, 5) != session_script(_spec(seed=4), 5)


def test_sessions_share_a_few_system_prompts_about_equally() -> None:
    spec = _spec(system_prompts=4)
    picks = [session_script(spec, s).system_prompt for s in range(800)]
    assert sorted(set(picks)) == [0, 1, 2, 3]
    assert all(150 <= picks.count(p) <= 250 for p in range(4))  # 200 each expected
    one = _spec(system_prompts=1)
    assert {session_script(one, s).system_prompt for s in range(50)} == {0}


def test_tool_turns_and_waits_follow_their_stated_means() -> None:
    spec = _spec(turns=5, think_s=2.0, tool_s=0.5, tool_fraction=0.3, return_fraction=0.0)
    later = [turn for s in range(2000) for turn in session_script(spec, s).turns[1:]]
    tools = [t.wait_s for t in later if t.tool]
    users = [t.wait_s for t in later if not t.tool]
    assert len(tools) / len(later) == pytest.approx(0.3, abs=0.02)
    assert statistics.mean(tools) == pytest.approx(0.5, rel=0.06)
    assert statistics.mean(users) == pytest.approx(2.0, rel=0.06)
    assert not any(t.returning for t in later)


def test_returning_sessions_come_back_once_after_the_gap() -> None:
    spec = _spec(turns=4, return_fraction=0.25, return_gap_s=30.0, think_s=1.0, tool_s=1.0)
    scripts = [session_script(spec, s) for s in range(2000)]
    returning = [[t for t in s.turns if t.returning] for s in scripts]
    assert all(len(r) <= 1 for r in returning)
    share = sum(1 for r in returning if r) / len(scripts)
    assert share == pytest.approx(0.25, abs=0.03)
    assert all(r[0].wait_s >= 30.0 for r in returning if r)
    assert not any(s.turns[0].returning for s in scripts)
    # One turn, nowhere to leave: nobody returns.
    assert not any(t.returning for s in range(100) for t in session_script(_spec(turns=1), s).turns)


def _plan(value: float, requests: int | None = 5, *, closed: bool = True, **kw: float) -> LoadPlan:
    mode = LoadMode.CONCURRENCY if closed else LoadMode.RATE
    return LoadPlan(Load(mode=mode, value=value), max_requests=requests, **kw)  # type: ignore[arg-type]


def test_a_turn_is_due_its_wait_after_the_answer_and_a_session_ends_after_its_last() -> None:
    spec = _spec(turns=3)
    loop = SessionLoop(_plan(1, 100), spec)
    first = loop.start(0.0)
    assert first == TurnSlot(0, 0, 0.0, False)
    script = loop.scripts[0]
    second = loop.next(first, 1.5)
    assert second == TurnSlot(0, 1, 1.5 + script.turns[1].wait_s, False)
    third = loop.next(second, 4.0)
    assert third is not None and third.turn == 2
    assert loop.next(third, 6.0) is None and loop.scripts == {}
    assert loop.start(6.0) == TurnSlot(1, 0, 6.0, False)
    assert loop.peak_live == 1


def test_a_failed_turn_ends_its_session() -> None:
    loop = SessionLoop(_plan(1, 100), _spec())
    first = loop.start(0.0)
    assert first is not None
    assert loop.next(first, 1.0, ok=False) is None and loop.scripts == {}


def test_warmup_and_max_requests_count_turns() -> None:
    loop = SessionLoop(_plan(2, 3, warmup_requests=2), _spec(turns=10))
    a, b = loop.start(0.0), loop.start(0.0)
    assert a is not None and b is not None and a.warmup and b.warmup
    c = loop.next(a, 1.0)
    d = loop.next(b, 1.0)
    e = loop.next(c, 2.0) if c is not None else None
    assert [s.warmup for s in (c, d, e) if s is not None] == [False, False, False]
    assert loop.measured == 3
    assert e is not None and loop.next(e, 3.0) is None
    assert loop.stopped and loop.start(3.0) is None


def test_a_duration_level_hands_out_no_turn_due_after_its_end() -> None:
    loop = SessionLoop(_plan(1, None, duration_s=10.0), _spec(turns=50, think_s=1.0, tool_s=1.0))
    slot = loop.start(0.0)
    assert loop.end_s == 10.0
    sends = []
    while slot is not None:
        sends.append(slot.send_s)
        slot = loop.next(slot, slot.send_s + 0.5)
    assert sends and max(sends) < 10.0
    assert loop.start(10.0) is None


def test_the_spec_refuses_what_makes_no_sense_and_describes_itself() -> None:
    with pytest.raises(ConfigError, match="--tool-fraction"):
        AgenticSpec(tool_fraction=1.5)
    with pytest.raises(ConfigError, match="--return-gap"):
        AgenticSpec(return_gap_s=-1.0)
    with pytest.raises(ConfigError, match="--system-prompts"):
        AgenticSpec(system_prompts=0)
    with pytest.raises(ConfigError, match="--sessions does not apply"):
        WorkloadSpec(kind=WorkloadKind.AGENTIC, sessions=4)
    with pytest.raises(ConfigError, match="session by session"):
        workload_shapes(_spec(), 10)
    described = describe(_spec(think_s=2.5))
    assert described["kind"] == "agentic" and described["think_s"] == 2.5
    assert described["turns"] == 6 and described["system_prompt_tokens"] == 500
