"""The HTTP data path: an OpenAI-compatible gateway in front of vLLM replicas."""

from __future__ import annotations

from servepilot.gateway.answer import REPLICA_HEADER
from servepilot.gateway.app import Gateway
from servepilot.gateway.fleet_gauges import FleetFacts
from servepilot.gateway.pool import ReplicaNotFound, ReplicaPool
from servepilot.gateway.replica import ReplicaInfo
from servepilot.gateway.serve import run_gateway, serve

__all__ = [
    "REPLICA_HEADER",
    "FleetFacts",
    "Gateway",
    "ReplicaInfo",
    "ReplicaNotFound",
    "ReplicaPool",
    "run_gateway",
    "serve",
]
