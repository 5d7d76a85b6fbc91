"""fleet.yaml's `cluster` section: defaults that keep the local backend, Ray's fields validated
with the field named, and each field explained by `servepilot config`."""

from __future__ import annotations

import pytest

from servepilot.core.annotated_yaml import render_yaml
from servepilot.core.config import ClusterBackend, FleetConfig, Placement, parse_config
from servepilot.core.errors import ConfigError


def test_defaults_keep_local_processes_and_spread_on_ray() -> None:
    cluster = FleetConfig().cluster
    assert cluster.backend is ClusterBackend.LOCAL
    assert (cluster.address, cluster.placement) == ("auto", Placement.SPREAD)
    assert (cluster.placement_timeout_s, cluster.cpus_per_replica) == (120.0, 1.0)
    assert cluster.max_restarts == -1


@pytest.mark.parametrize("address", ["auto", "local", "ray://head:10001", "10.0.0.5:6379"])
def test_every_address_form_is_accepted(address: str) -> None:
    config = parse_config({"cluster": {"backend": "ray", "address": address}}, origin="f.yaml")
    assert config.cluster.address == address


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"address": "http://head:8265"}, r"cluster\.address: .*ray://host:port.*'http://"),
        ({"backend": "kubernetes"}, r"cluster\.backend: Input should be 'local' or 'ray'"),
        ({"placement": "strict_spread"}, r"cluster\.placement: Input should be 'spread' or"),
        ({"placement_timeout_s": 0}, r"cluster\.placement_timeout_s: .*greater than 0"),
        ({"cpus_per_replica": -1}, r"cluster\.cpus_per_replica: .*greater than 0"),
        ({"max_restarts": -2}, r"cluster\.max_restarts: .*greater than or equal to -1"),
        ({"placment": "pack"}, r"cluster\.placment: unknown field; did you mean `placement`"),
    ],
)
def test_a_bad_field_is_named(section: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"cluster": section}, origin="fleet.yaml")
    assert caught.match(named)


def test_servepilot_config_explains_the_cluster_section() -> None:
    text = render_yaml(FleetConfig())
    section = text.split("\ncluster:\n", 1)[1]
    assert "  backend: local" in section
    assert "  # backend ray: how long the replicas' placement groups may wait" in section
    assert "  placement_timeout_s: 120.0" in section
