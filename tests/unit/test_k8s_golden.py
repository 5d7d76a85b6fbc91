"""The parts of the manifests that carry the seeds' numbers, exactly: HPA bounds and steps,
the spread between replicas, priorities, probes sized for the cold start, alert metric names."""

from __future__ import annotations

from servepilot.core.config import parse_config
from servepilot.fleet.k8s.rayservice import engine_kwargs
from tests.unit.k8s_support import DEEPSEEK_H200, FLEETS, TWO_NODE, by_kind, fleet, rendered

SEEDS_BEHAVIOUR = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Percent", "value": 10, "periodSeconds": 60},
            {"type": "Pods", "value": 1, "periodSeconds": 60},
        ],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 300,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Percent", "value": 5, "periodSeconds": 60},
            {"type": "Pods", "value": 1, "periodSeconds": 60},
        ],
    },
}


def test_hpa_carries_the_seeds_bounds_steps_and_target() -> None:
    (hpa,) = by_kind(rendered(fleet(FLEETS["deepseek-h200"])), "HorizontalPodAutoscaler")
    spec = hpa["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 20)  # scaling.step's StepRules
    assert spec["behavior"] == SEEDS_BEHAVIOUR
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "servepilot-vllm",
    }
    (metric,) = spec["metrics"]
    # 80% of the default 256-request budget per replica.
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "204800m"}
    assert metric["external"]["metric"]["name"] == "servepilot_demand_requests"


def test_keda_scales_the_leader_worker_set_with_the_same_steps() -> None:
    (scaled,) = by_kind(
        rendered(fleet(FLEETS["two-node"], autoscaling={"autoscaler": "keda"})), "ScaledObject"
    )
    spec = scaled["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 20)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == SEEDS_BEHAVIOUR
    assert spec["scaleTargetRef"]["kind"] == "LeaderWorkerSet"  # multi-node replicas scale too
    (trigger,) = spec["triggers"]
    assert trigger["metadata"]["threshold"] == "204.8"
    assert "servepilot_queue_depth" in trigger["metadata"]["query"]  # the cold-start demand


def test_replicas_spread_one_node_apart() -> None:
    (deployment,) = [
        d
        for d in by_kind(rendered(fleet(FLEETS["deepseek-h200"])), "Deployment")
        if d["metadata"]["name"] == "servepilot-vllm"
    ]
    (constraint,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert constraint == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
    }


def test_pack_placement_drops_the_spread() -> None:
    config = parse_config({**DEEPSEEK_H200, "cluster": {"placement": "pack"}}, origin="test")
    for deployment in by_kind(rendered(config), "Deployment"):
        assert "topologySpreadConstraints" not in deployment["spec"]["template"]["spec"]


def test_priority_classes_interactive_above_batch_and_batch_never_preempts() -> None:
    files = rendered(fleet(FLEETS["embedded"]))
    classes = {p["metadata"]["name"]: p for p in by_kind(files, "PriorityClass")}
    interactive, batch = classes["servepilot-interactive"], classes["servepilot-batch"]
    assert (interactive["value"], batch["value"]) == (100_000, 1_000)
    assert batch["preemptionPolicy"] == "Never"
    assert not interactive["globalDefault"] and not batch["globalDefault"]
    pods = [d["spec"]["template"]["spec"] for d in by_kind(files, "Deployment")]
    assert {p["priorityClassName"] for p in pods} == {"servepilot-interactive"}


def test_startup_probe_covers_the_cold_start_and_drain_precedes_sigterm() -> None:
    config = fleet(FLEETS["two-node"])
    (lws,) = by_kind(rendered(config), "LeaderWorkerSet")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    container = leader["containers"][0]
    startup = container["startupProbe"]
    # engine.startup_timeout_s 600: ten minutes before the kubelet gives up.
    assert startup["periodSeconds"] * startup["failureThreshold"] == 600
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "30"]
    # drain 30 s + engine.stop_grace_s 20 s + 5 s margin.
    assert leader["terminationGracePeriodSeconds"] == 55
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in leader[
        "volumes"
    ]
    assert {"name": "model", "hostPath": {"path": "/mnt/nvme/models", "type": "Directory"}} in (
        leader["volumes"]
    )


def test_alerts_read_vllms_current_names_and_export_nothing_under_vllm() -> None:
    (rule,) = by_kind(rendered(fleet(FLEETS["embedded"])), "PrometheusRule")
    exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    assert "vllm:kv_cache_usage_perc" in exprs
    assert "vllm:num_preemptions_total" in exprs
    assert "gpu_cache_usage_perc" not in exprs
    assert all(
        not r.get("record", "").startswith("vllm:") for r in rule["spec"]["groups"][0]["rules"]
    )


def test_the_embedded_model_is_converted_into_the_volume_by_an_init_container() -> None:
    (deployment,) = [
        d for d in by_kind(rendered(fleet(FLEETS["embedded"])), "Deployment")
        if d["metadata"]["name"] == "servepilot-vllm"
    ]  # fmt: skip
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["servepilot", "models", "pull", "smollm2"]
    assert init["env"] == [{"name": "SERVEPILOT_CACHE", "value": "/models/.servepilot"}]
    command = pod["containers"][0]["command"]
    assert command[command.index("--model") + 1] == (
        "/models/.servepilot/models/smollm2-135m-instruct"
    )
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["requests"]


def test_ray_service_runs_the_same_engine_knobs() -> None:
    (service,) = by_kind(rendered(fleet(TWO_NODE, runtime="ray")), "RayService")
    assert "build_openai_app" in service["spec"]["serveConfigV2"]
    argv = (
        "vllm", "serve", "/m", "--tensor-parallel-size", "8", "--enforce-eager",
        "--no-enable-prefix-caching", "--gpu-memory-utilization", "0.9", "--port", "8000",
    )  # fmt: skip
    assert engine_kwargs(argv) == {
        "tensor_parallel_size": 8,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "gpu_memory_utilization": 0.9,
    }


def test_the_autoscaler_owns_the_replica_count() -> None:
    for name in ("deepseek-h200", "two-node"):
        files = rendered(fleet(FLEETS[name]))
        for workload in by_kind(files, "Deployment") + by_kind(files, "LeaderWorkerSet"):
            if workload["metadata"]["name"] == "servepilot-vllm":
                assert "replicas" not in workload["spec"]  # a re-apply keeps the HPA's count


def test_keda_scales_from_zero_on_the_gateways_queue() -> None:
    config = fleet(FLEETS["deepseek-h200"], autoscaling={"autoscaler": "keda", "min_replicas": 0})
    (scaled,) = by_kind(rendered(config), "ScaledObject")
    spec = scaled["spec"]
    assert spec["minReplicaCount"] == 0
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": 1}
    trigger = spec["triggers"][0]["metadata"]
    # One queued request at the gateway (held through the cold start) wakes the replicas.
    assert trigger["activationThreshold"] == "0"
    assert trigger["query"] == (
        'sum(servepilot_in_flight_requests{namespace="servepilot",service="servepilot-gateway"})'
        ' + (sum(servepilot_queue_depth{namespace="servepilot",service="servepilot-gateway"})'
        " or vector(0))"
    )


def test_the_gateway_pod_runs_a_command_servepilot_parses_on_its_configmap() -> None:
    from servepilot.cli.main import build_parser
    from servepilot.core.yamlfile import parse_yaml

    config = fleet(FLEETS["deepseek-h200"])
    files = rendered(config)
    (config_map,) = [
        c for c in by_kind(files, "ConfigMap") if c["metadata"]["name"].endswith("gateway")
    ]
    loaded = parse_config(parse_yaml(config_map["data"]["fleet.yaml"], origin="cm"), origin="cm")
    assert loaded.gateway == config.gateway.model_copy(update={"host": "0.0.0.0", "port": 8000})
    (gateway,) = [
        d for d in by_kind(files, "Deployment") if d["metadata"]["name"].endswith("gateway")
    ]
    command = gateway["spec"]["template"]["spec"]["containers"][0]["command"]
    args = build_parser().parse_args(command[1:])
    assert args.discover == "k8s:servepilot-vllm"
    assert str(args.config) == "/etc/servepilot/fleet.yaml"


def test_given_bounds_and_steps_replace_the_seeds() -> None:
    steps = {"min_replicas": 3, "max_replicas": 8, "target_utilisation": 0.5,
             "scale_up_percent": 50, "scale_down_percent": 20}  # fmt: skip
    (hpa,) = by_kind(
        rendered(fleet(FLEETS["deepseek-h200"], autoscaling=steps)), "HorizontalPodAutoscaler"
    )
    spec = hpa["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (3, 8)
    assert spec["behavior"]["scaleUp"]["policies"][0]["value"] == 50
    assert spec["behavior"]["scaleDown"]["policies"][0]["value"] == 20
    assert spec["metrics"][0]["external"]["target"]["averageValue"] == "128"  # 0.5 x 256


def test_the_bounds_of_an_enabled_autoscale_section_carry_over_to_the_hpa() -> None:
    # policy target: the HPA runs it (step and predictive run in the gateway).
    data = FLEETS["deepseek-h200"] | {
        "autoscale": {"enabled": True, "policy": "target", "min_replicas": 3, "max_replicas": 6}
    }
    (hpa,) = by_kind(rendered(fleet(data)), "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 6)
    # kubernetes.autoscaling's own bounds win; a disabled section leaves the seeds' 2 and 20.
    (hpa,) = by_kind(
        rendered(fleet(data, autoscaling={"max_replicas": 9})), "HorizontalPodAutoscaler"
    )
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 9)
    off = FLEETS["deepseek-h200"] | {"autoscale": {"min_replicas": 3, "max_replicas": 6}}
    (hpa,) = by_kind(rendered(fleet(off)), "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 20)
