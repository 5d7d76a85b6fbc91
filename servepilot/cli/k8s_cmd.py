"""`servepilot k8s render`: a fleet.yaml as Kubernetes manifests plus a kustomization."""

from __future__ import annotations

import argparse
from pathlib import Path

from servepilot.cli.console import out_console, print_step
from servepilot.cli.options import Commands, add_command, add_config_flag, config_from_args
from servepilot.core.config import Autoscaler, FleetConfig, Runtime
from servepilot.engine.cpu import cpu_flags
from servepilot.fleet.k8s import Monitoring, check, render
from servepilot.fleet.k8s.files import write_files
from servepilot.observe import alert_rules, dashboard
from servepilot.plan.planner import make_plan
from servepilot.plan.request import PlanRequest

DESCRIPTION = """\
Write the manifests that run the fleet of fleet.yaml on a Kubernetes cluster, one file per
component plus a kustomization.yaml, ready for `kubectl apply -k DIR`:
  namespace.yaml        the namespace
  priorityclasses.yaml  PriorityClasses <name>-interactive (serving pods) and <name>-batch
  vllm.yaml             the vLLM replicas (a Deployment, or a LeaderWorkerSet when one replica
                        spans nodes), their headless Service and PodDisruptionBudget
  autoscaling.yaml      an autoscaling/v2 HPA on the gateway's demand (plus the
                        prometheus-adapter rule serving it), or a KEDA ScaledObject; with
                        an enabled autoscale section of policy step or predictive, the
                        gateway runs that policy instead, and this file holds the Role
                        (and RoleBinding) letting it scale the replicas' Deployment
  rayservice.yaml       with --runtime ray, instead of the two above: a KubeRay RayService
  gateway.yaml          the gateway (Deployment, Service, ConfigMap of its config) and the RBAC
                        it needs to discover the replicas' endpoints
  monitoring.yaml       a ServiceMonitor, a PrometheusRule with the alerts of `servepilot
                        observe render` (matching the namespace's series only) and its
                        Grafana dashboard as a ConfigMap labelled grafana_dashboard: "1"
                        for Grafana's dashboard sidecar
The vLLM command is the one `plan` prints and `up` launches; the pods' resources come from the
plan. fleet.yaml's `kubernetes` section sets the images, the model volume and autoscaling
(`servepilot config` lists its fields). A fleet that cannot run as asked is refused with the
field to change.
"""


def register(sub: Commands) -> None:
    k8s = sub.add_parser("k8s", help="render the fleet as Kubernetes manifests",
                         description="Kubernetes: render the fleet as manifests.")  # fmt: skip
    ksub = k8s.add_subparsers(dest="k8s_command", metavar="ACTION", required=True)
    help = "write manifests and a kustomization.yaml to --out"
    parser = add_command(ksub, "render", help, DESCRIPTION, run)
    add_config_flag(parser)
    add = parser.add_argument
    add("--out", type=Path, required=True, metavar="DIR",
        help="folder to write the manifests to (created)")  # fmt: skip
    add("--namespace", metavar="NS", help="namespace (default: kubernetes.namespace, servepilot)")
    add("--autoscaler", choices=[a.value for a in Autoscaler],
        help="hpa: autoscaling/v2 through prometheus-adapter; keda: a ScaledObject "
        "(default: kubernetes.autoscaling.autoscaler, hpa)")  # fmt: skip
    add("--runtime", choices=[r.value for r in Runtime],
        help="vllm: vLLM pods; ray: a KubeRay RayService (default: kubernetes.runtime, "
        "vllm)")  # fmt: skip


def monitoring_of(config: FleetConfig) -> Monitoring:
    """observe's alert rules, matching the fleet's namespace (one Prometheus watches every
    namespace of a cluster), and its dashboard."""
    rules = alert_rules(config, {"namespace": config.kubernetes.namespace})
    return Monitoring(rule_groups=tuple(rules["groups"]), dashboard=dashboard(config))


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args, {
        "kubernetes.namespace": "namespace",
        "kubernetes.autoscaling.autoscaler": "autoscaler",
        "kubernetes.runtime": "runtime",
    })  # fmt: skip
    check(config)  # the refusals that need no plan, before planning reads the model
    plan = make_plan(PlanRequest.from_fleet(config, cpu_flags()))
    files = render(config, plan, monitoring_of(config))
    out: Path = args.out
    write_files(files, out)
    for manifest in files:
        kinds = ", ".join(obj["kind"] for obj in manifest.objects)
        out_console.print(f"  {manifest.name}: {kinds}", markup=False)
    print_step(f"wrote {len(files)} files to {out}; apply them with `kubectl apply -k {out}`")
    return 0
