"""`servepilot gateway`: the gateway alone, in front of OpenAI-compatible servers run elsewhere."""

from __future__ import annotations

import argparse
from pathlib import Path

from servepilot.cli.console import out_console, print_step
from servepilot.cli.options import Commands, add_command, add_config_flag, config_from_args
from servepilot.cli.up_cmd import predicted_step_model
from servepilot.core import accel
from servepilot.core.config import PolicyName
from servepilot.core.errors import ConfigError
from servepilot.core.urls import base_url
from servepilot.fleet.autoscale.start import cluster_autoscaler
from servepilot.fleet.k8s.backend import KubernetesBackend
from servepilot.fleet.membership import following
from servepilot.fleet.serve import check_port_free, fleet_facts
from servepilot.gateway import run_gateway

DESCRIPTION = """\
Run servepilot's gateway in front of vLLM (or any OpenAI-compatible) servers that you started
yourself (--replica URL), or in a Kubernetes pod in front of a Service's ready endpoints
(--discover). The gateway checks each replica's /health, routes around those that fail, gives
each replica at most --capacity requests at once and queues the rest by priority (X-Priority:
0 interactive, 1 default, 2 batch), and serves one endpoint: vLLM's OpenAI-compatible routes
(chat, completions, responses, embeddings, score, rerank, pooling, audio, tokenizer; a request
may leave out `model` when the replicas serve one). Every other setting (admission budgets,
circuit breakers, hard and soft limits, API keys) comes from fleet.yaml's `gateway` section
(`servepilot config`); with -c, /metrics also has batch utilisation and cost per QPS. An
access log line (--access-log) has method, path, status, replica, class, sizes, TTFB/TTFT/E2E
ms and error. Ctrl-C (or SIGTERM) drains in-flight requests, writes the last access log
lines, and stops.
"""


def register(sub: Commands) -> None:
    help = "run only the gateway, in front of replicas you already run"
    parser = add_command(sub, "gateway", help, DESCRIPTION, run)
    add_config_flag(parser)
    add = parser.add_argument
    add("--replica", action="append", default=[], metavar="URL",
        help="base URL of a replica, e.g. http://10.0.0.5:8000 (without /v1); repeat for "
        "each")  # fmt: skip
    add("--discover", metavar="k8s:SERVICE[.NS]",
        help="in a Kubernetes pod: follow the ready endpoints of SERVICE (in namespace NS, "
        "default the pod's own) through its EndpointSlices; replicas join and leave as they "
        "become ready, scale or go (the pod's service account needs list on "
        "endpointslices)")  # fmt: skip
    add("--scale-deployment", metavar="NAME",
        help="with --discover and an enabled autoscale section (policy step or predictive) in "
        "--config: autoscale the replicas' Deployment NAME from the gateway through its scale "
        "subresource, draining a pod before it goes; with replicas.asleep, that many pods are "
        "kept asleep behind those serving and woken before the Deployment grows (the service "
        "account needs get/patch on deployments/scale and patch on pods; `servepilot k8s "
        "render` writes the Role)")  # fmt: skip
    add("--policy", choices=[p.value for p in PolicyName],
        help="routing policy (default: gateway.policy from fleet.yaml, else hybrid)")  # fmt: skip
    add("--capacity", type=int, metavar="N",
        help="requests in flight per replica at most; more wait in the gateway's queue "
        "(default: gateway.admission.replica_concurrency, 256)")  # fmt: skip
    add("--port", type=int, metavar="P", help="port to listen on (default 8000)")
    add("--host", metavar="ADDR", help="address to listen on (default 127.0.0.1)")
    add("--access-log", type=Path, metavar="PATH",
        help="append one JSON line per request to PATH, written in the background (default: "
        "gateway.access_log.path, else none; gateway.access_log sets sampling and "
        "buffering)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    overrides = {
        "gateway.policy": "policy",
        "gateway.port": "port",
        "gateway.host": "host",
        "gateway.admission.replica_concurrency": "capacity",
    }
    fleet = config_from_args(args, overrides)
    config = fleet.gateway
    # With a fleet.yaml, its max_num_seqs and hardware price turn the batch and cost gauges on.
    facts = fleet_facts(fleet) if args.config is not None else None
    urls = [base_url(u, "--replica") for u in args.replica]
    source = None
    if args.discover:
        source = KubernetesBackend.discover(
            args.discover, args.scale_deployment, sleep_mode=fleet.engine.sleep_mode
        )
    if not urls and source is None:
        raise ConfigError("give at least one --replica URL, or --discover k8s:SERVICE")
    alongside = cluster_autoscaler(fleet, source, args.scale_deployment)
    check_port_free(config.host, config.port)

    upstreams = [*urls, *([args.discover] if source is not None else [])]

    def started(port: int) -> None:
        out_console.print(
            f"gateway on http://{config.host}:{port}/v1 -> {', '.join(upstreams)} "
            f"(policy {config.policy.value}); Ctrl-C stops"
        )
        # Whether the data path runs compiled (`make gateway-fast`), and if not, why not.
        out_console.print(f"gateway data path: {accel.status(accel.GATEWAY)}")

    if args.access_log is not None and not config.access_log.enabled:
        config = config.model_copy(
            update={"access_log": config.access_log.model_copy(update={"enabled": True})}
        )
    replicas = [(f"r{i}", url) for i, url in enumerate(urls)]
    run_gateway(
        config,
        replicas,
        on_started=started,
        access_log_path=args.access_log,
        members=None if source is None else lambda gw: following(source, gw.membership),
        facts=facts,
        alongside=alongside,
        step_model=predicted_step_model(fleet),
    )
    print_step("stopped")
    return 0
