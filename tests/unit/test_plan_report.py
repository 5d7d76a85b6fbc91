"""What a plan tells a reader: the text of its lines and tables, with known answers (the numbers
of the embedded model on the CPU, and of plans that do not fit or cross the cost line)."""

from __future__ import annotations

from servepilot.core.config import TrafficConfig
from servepilot.core.slo import Slo
from servepilot.plan import report
from servepilot.plan.dtypes import KvDtype
from servepilot.plan.hardware import get_accelerator, with_overrides
from servepilot.plan.planner import Plan, make_plan
from servepilot.plan.presets import load_model
from servepilot.plan.request import PlanRequest


def plan(model: str, accelerator: str, count: int, **traffic: float) -> Plan:
    spec = load_model(model)
    acc = with_overrides(
        get_accelerator(accelerator), memory_gib=2.0 if accelerator == "cpu" else None
    )
    return make_plan(
        PlanRequest(
            model=spec,
            model_ref=model,
            accelerator=acc,
            count=count,
            nodes=1,
            weights_dtype=spec.checkpoint_dtype,
            kv_dtype=KvDtype.AUTO,
            traffic=TrafficConfig(**traffic),
            slo=Slo(),
        )
    )


def test_the_embedded_model_on_cpu_reads_as_vllm_cpu_reports_it() -> None:
    found = plan("smollm2", "cpu", 1)
    assert report.headline(found) == "smollm2 on 1 x 1 cpu: TP1, 1 replica(s)"
    assert report.verdict(found) == "fits"
    assert report.kv_line(found) == (
        "KV cache: 23,040 B/token (2 x 30 layers x 3 kv_heads x 64 x 2 B); 93,184 tokens per "
        "replica; 30.33 requests of 3,072 tokens"
    )
    memory = report.memory_table(found)
    assert memory.columns == ("part", "GB", "note") and memory.right == ("GB",)
    assert memory.rows[0] == ("weights", "0.27", "in host memory")
    assert memory.rows[3] == ("KV cache", "2.15", "--kv-cache-memory-bytes")
    assert memory.rows[-1] == ("total", "2.15", "cpu")
    knobs = {row[0]: row[1] for row in report.knob_table(found).rows}
    assert knobs["gpu_memory_utilization"] == "-" and knobs["max_model_len"] == "3,072"
    assert knobs["enable_chunked_prefill"] == "True"
    assert report.advice_line(found).startswith("advice: single-node: no target QPS given")


def test_knob_values_print_counts_with_separators_and_flags_as_words() -> None:
    assert report.knob_value(None) == "-"
    assert report.knob_value(8192) == "8,192"
    assert report.knob_value(True) == "True"
    assert report.knob_value(0.9) == "0.9"


def test_a_plan_that_does_not_fit_says_how_short_and_lists_the_ladder() -> None:
    found = plan("llama-3.1-70b", "l40s", 1)
    assert report.verdict(found) == "does not fit: 103.0 GB short per device"
    ladder = report.ladder_table(found)
    assert ladder.title == "to make it fit (the memory ladder)" and ladder.right == ()
    assert ladder.rows[0] == ("quantize the KV cache to fp8", "no", "TP1", "141.1", "0", "0.00")
    # 141 GB of bf16 weights (the untied head included) over 48 GB devices: four of the
    # node's L40S (TP4), not four nodes of one (TP1+PP4).
    assert ladder.rows[-1] == (
        "or, at the original precision, with --count 4",
        "yes",
        "TP4",
        "35.3",
        "53,024",
        "17.26",
    )


def test_cost_line_without_a_target_is_the_hourly_price_only() -> None:
    line = report.cost_line(plan("smollm2", "cpu", 1))
    assert line.price == "cost: $0.10/hour" and line.over_line == ""
    assert line.basis == (
        " — no target QPS (traffic.target_qps): only the hourly price of the planned hardware "
        "is known"
    )


def test_cost_line_over_the_qps_line_says_so_apart() -> None:
    found = plan("deepseek-v3", "h200", 8, target_qps=500.0)
    assert found.estimates is not None and found.estimates.replicas_for_target == 19
    # At H200's measured ceilings (not the datasheet's, which said 17 nodes):
    # 19 nodes x 8 x $6.305 = $958.36/hour; / 500 QPS; / 460.8 M output tokens an hour.
    over = report.cost_line(found)
    assert over.price == (
        "cost: $50.44/hour as planned; 500 QPS needs 19 node(s): $958.36/hour, "
        "$1.9167 per QPS-hour, $2.080 per 1M output tokens"
    )
    assert over.over_line == " (over the $0.1 per QPS cost line)"
    # smollm2 on 8 x H100 carries 500 QPS on one node: $49.24/hour / 500 = $0.0985.
    under = report.cost_line(plan("smollm2", "h100", 8, target_qps=500.0))
    assert under.price.endswith("$0.0985 per QPS-hour, $0.107 per 1M output tokens")
    assert under.over_line == ""


def test_estimates_table_has_both_points_and_the_fleet_in_its_caption() -> None:
    found = plan("llama-3.1-70b", "h100", 8, target_qps=500.0)
    assert found.estimates is not None
    table = report.estimates_table(found.estimates)
    assert table.title.startswith("estimates per replica (step times: ")
    assert [row[0] for row in table.rows] == ["one request alone", "at capacity"]
    assert table.right == ("in flight", "TTFT ms", "TPOT ms", "output tok/s", "requests/s")
    caption = table.caption.splitlines()
    assert caption[0].startswith("capacity is bounded by ") and "2 replica(s)" in caption[0]
    assert caption[1].startswith("the target QPS needs ")
    assert caption[-1].startswith("steady state at the mean lengths, no queueing")


def test_the_model_list_says_which_preset_runs_on_vllm() -> None:
    from servepilot.plan.presets import preset_names, preset_table

    table = preset_table("smollm2")
    rows = {row[0]: row for row in table.rows}
    assert list(rows) == preset_names()
    assert rows["smollm2"][3] == "up (vLLM), plan, sim"
    assert rows["deepseek-v3"][1:] == (
        "683B",
        "DeepseekV3ForCausalLM",
        "up --engine sim, plan, sim",
    )
    assert table.right == ("parameters",)
