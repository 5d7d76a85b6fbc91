"""fleet.yaml as a pydantic model: one module per section, composed by `fleet.py` into
`FleetConfig`, the one configuration that drives plan, up, tune and sim. Import the names
from here; the modules are the sections' homes."""

from servepilot.core.config.adaptive_budget import AdaptiveBudgetConfig, RateBasis
from servepilot.core.config.autoscale import AutoscaleConfig, ScalingPolicyName, parse_bounds
from servepilot.core.config.batch import BatchConfig
from servepilot.core.config.cluster import ClusterBackend, ClusterConfig, Placement
from servepilot.core.config.engine import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    EngineConfig,
    EngineKind,
    KvOffloadBackend,
    shared_memory_utilization,
)
from servepilot.core.config.fleet import FleetConfig, load_config, parse_config
from servepilot.core.config.gateway import (
    AccessLogConfig,
    AdmissionConfig,
    ApiKey,
    AuthConfig,
    GatewayConfig,
    KvIndexConfig,
    PolicyName,
    Priority,
    ProtectionConfig,
    RoutingConfig,
)
from servepilot.core.config.hardware import Device, HardwareConfig
from servepilot.core.config.kubernetes import (
    Autoscaler,
    KubernetesAutoscalingConfig,
    KubernetesConfig,
    ModelVolumeConfig,
    Runtime,
    VolumeKind,
)
from servepilot.core.config.model import EMBEDDED_MODEL, ModelConfig, Weights
from servepilot.core.config.replicas import ReplicasConfig
from servepilot.core.config.traffic import TrafficConfig
from servepilot.core.config.warm_pool import check_warm_pool, pool_parks

__all__ = [
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "EMBEDDED_MODEL",
    "AccessLogConfig",
    "AdaptiveBudgetConfig",
    "AdmissionConfig",
    "ApiKey",
    "AuthConfig",
    "AutoscaleConfig",
    "Autoscaler",
    "BatchConfig",
    "ClusterBackend",
    "ClusterConfig",
    "Device",
    "EngineConfig",
    "EngineKind",
    "FleetConfig",
    "GatewayConfig",
    "HardwareConfig",
    "KubernetesAutoscalingConfig",
    "KubernetesConfig",
    "KvIndexConfig",
    "KvOffloadBackend",
    "ModelConfig",
    "ModelVolumeConfig",
    "Placement",
    "PolicyName",
    "Priority",
    "ProtectionConfig",
    "RateBasis",
    "ReplicasConfig",
    "RoutingConfig",
    "Runtime",
    "ScalingPolicyName",
    "TrafficConfig",
    "VolumeKind",
    "Weights",
    "check_warm_pool",
    "load_config",
    "parse_bounds",
    "parse_config",
    "pool_parks",
    "shared_memory_utilization",
]
