"""The gateway on Kubernetes: its Deployment and Service, the ConfigMap of its fleet.yaml
section, and the RBAC to read the replicas' EndpointSlices (it discovers them itself, so
scaling needs no admin calls)."""

from __future__ import annotations

import yaml

from servepilot.core.config import Runtime
from servepilot.core.errors import ConfigError
from servepilot.fleet.k8s.pods import Manifest
from servepilot.fleet.k8s.target import HTTP_PORT, Target

CONFIG_DIR = "/etc/servepilot"
# Secret holding the values of gateway.auth's key_env variables (created by the user).
KEYS_SECRET_SUFFIX = "gateway-keys"


def gateway_objects(target: Target) -> list[Manifest]:
    return [
        service_account(target),
        discovery_role(target),
        discovery_binding(target),
        config_map(target),
        gateway_deployment(target),
        gateway_service(target),
    ]


def discovered_service(target: Target) -> str:
    """The Service whose endpoints are the replicas: ours, or the one KubeRay makes."""
    if target.kube.runtime is Runtime.RAY:
        return f"{target.names.vllm}-serve-svc"
    return target.names.vllm


def service_account(target: Target) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": target.metadata(target.names.gateway, "gateway"),
    }


def discovery_role(target: Target) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": target.metadata(target.names.gateway, "gateway"),
        "rules": [
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }


def discovery_binding(target: Target) -> Manifest:
    name = target.names.gateway
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": target.metadata(name, "gateway"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": target.kube.namespace}],
    }


def config_map(target: Target) -> Manifest:
    gateway = target.config.gateway
    for index, key in enumerate(gateway.auth.keys):
        if key.key is not None:
            raise ConfigError(
                f"gateway.auth.keys.{index}.key: a literal API key would be written into a "
                "ConfigMap, readable by anyone who can read the namespace",
                hint=f"use key_env and put the key in the Secret {_keys_secret(target)}",
            )
    section = gateway.model_dump(mode="json") | {"host": "0.0.0.0", "port": HTTP_PORT}
    sections: dict[str, object] = {"gateway": section}
    if target.gateway_scales:
        # The autoscaler the gateway runs reads these (the cold start: the startup timeout).
        config = target.config
        sections["autoscale"] = config.autoscale.model_dump(mode="json")
        engine: dict[str, object] = {"startup_timeout_s": config.engine.startup_timeout_s}
        if config.replicas.asleep:
            # Its warm pool: asleep in the pods' sleep mode (GPU), else parked (CPU).
            sections["replicas"] = {"asleep": config.replicas.asleep}
            engine["sleep_mode"] = config.engine.sleep_mode
        sections["engine"] = engine
    text = yaml.safe_dump(sections, sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": target.metadata(target.names.gateway, "gateway"),
        "data": {"fleet.yaml": text},
    }


def gateway_deployment(target: Target) -> Manifest:
    labels = target.names.labels("gateway")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": target.metadata(target.names.gateway, "gateway"),
        "spec": {
            "replicas": target.kube.gateway_replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": _gateway_pod(target)},
        },
    }


def gateway_service(target: Target) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": target.metadata(target.names.gateway, "gateway"),
        "spec": {
            "selector": target.names.labels("gateway"),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http"}],
        },
    }


def _gateway_pod(target: Target) -> Manifest:
    command = [
        "servepilot", "gateway", "--config", f"{CONFIG_DIR}/fleet.yaml",
        "--discover", f"k8s:{discovered_service(target)}",
    ]  # fmt: skip
    if target.gateway_scales:
        command += ["--scale-deployment", target.names.vllm]
    # Ready on /health, not /ready: with no replica ready the gateway must still take requests
    # and hold them through the replicas' cold start (scale from zero), not vanish from its
    # Service.
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5}
    container: Manifest = {
        "name": "gateway",
        "image": target.kube.gateway_image,
        "command": command,
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "readinessProbe": probe,
        "livenessProbe": probe | {"failureThreshold": 6},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    env = _key_env(target)
    if env:
        container["env"] = env
    return {
        "serviceAccountName": target.names.gateway,
        "priorityClassName": f"{target.names.prefix}-interactive",
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": target.names.gateway}}],
    }


def _key_env(target: Target) -> list[Manifest]:
    auth = target.config.gateway.auth
    names = [key.key_env for key in auth.keys if key.key_env is not None]
    if auth.admin_key_env is not None:
        names.append(auth.admin_key_env)
    secret = _keys_secret(target)
    return [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name}}}
        for name in sorted(set(names))
    ]


def _keys_secret(target: Target) -> str:
    return f"{target.names.prefix}-{KEYS_SECRET_SUFFIX}"
