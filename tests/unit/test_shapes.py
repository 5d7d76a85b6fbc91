"""Workload shapes (token counts only, for the simulator) match the workload bench sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from servepilot.bench.tokenizer import LocalTokenizer
from servepilot.bench.workload import build_workload
from servepilot.load.shapes import workload_shapes
from servepilot.load.workload import WorkloadKind, WorkloadSpec


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"timestamp": 10.0, "input_tokens": 50, "output_tokens": 7, "prefix_group": 1}\n'
        '{"timestamp": 10.5, "input_tokens": 40, "output_tokens": 9, "prefix_group": 1}\n'
        '{"timestamp": 11.0, "input_tokens": 30, "output_tokens": 5, "priority": 0}\n'
    )
    return path


@pytest.mark.parametrize(
    "spec",
    [
        WorkloadSpec(input_tokens=40, output_tokens=8, seed=3),
        WorkloadSpec(kind=WorkloadKind.MIXED, input_tokens=30, long_fraction=0.3, seed=5),
        WorkloadSpec(
            kind=WorkloadKind.SHARED_PREFIX,
            input_tokens=64,
            num_prefixes=3,
            priority_mix={0: 1.0, 2: 1.0},
            seed=7,
        ),
        WorkloadSpec(
            kind=WorkloadKind.MULTI_TURN,
            input_tokens=20,
            output_tokens=6,
            turns=3,
            active_sessions=2,
            sessions=None,
            seed=1,
        ),
        WorkloadSpec(input_tokens=16, sessions=4, seed=2),
    ],
    ids=["random", "mixed", "shared_prefix", "multi_turn", "sessions"],
)
def test_shapes_are_the_workloads_sizes_request_for_request(
    tok: LocalTokenizer, spec: WorkloadSpec
) -> None:
    requests = build_workload(spec, tok, 23)
    shapes = workload_shapes(spec, 23)
    assert len(shapes) == len(requests) == 23
    for request, shape in zip(requests, shapes, strict=True):
        assert shape.input_tokens == request.input_tokens
        assert shape.output_tokens == request.max_tokens
        assert shape.prefix_group == request.prefix_group or spec.kind is WorkloadKind.MULTI_TURN
        assert (shape.priority, shape.session_id) == (request.priority, request.session_id)
        assert shape.history_messages == len(request.history)
        history = sum(len(ids) for ids in tok.encode_batch([m for _, m in request.history]))
        assert shape.history_tokens == history


def test_trace_shapes_keep_times_groups_and_the_groups_shortest_prefix(
    tok: LocalTokenizer, tmp_path: Path
) -> None:
    spec = WorkloadSpec(kind=WorkloadKind.TRACE, trace_path=_trace(tmp_path), prefix_tokens=45)
    requests = build_workload(spec, tok, 10)
    shapes = workload_shapes(spec, 10)
    assert [s.at_s for s in shapes] == [r.at_s for r in requests] == [0.0, 0.5, 1.0]
    assert [s.input_tokens for s in shapes] == [50, 40, 30]
    # The group's prefix fits its shortest member (40 tokens), under --prefix-tokens 45.
    assert [s.prefix_tokens for s in shapes] == [40, 40, 0]
    assert shapes[2].priority == 0


def test_shapes_scale_to_millions_cheaply() -> None:
    shapes = workload_shapes(WorkloadSpec(kind=WorkloadKind.SHARED_PREFIX, num_prefixes=4), 200_000)
    groups = [s.prefix_group for s in shapes]
    assert {g: groups.count(g) for g in range(4)} == dict.fromkeys(range(4), 50_000)
