from pathlib import Path

import pytest

from servepilot.core.config import Device, FleetConfig, PolicyName, load_config, parse_config
from servepilot.core.errors import ConfigError


def test_no_file_gives_defaults_that_serve_the_embedded_model_on_cpu() -> None:
    config = load_config(None)
    assert config.model.source == "smollm2"
    assert config.hardware.device is Device.CPU
    assert config.replicas.count == 1
    assert config.gateway.port == 8000
    assert config.gateway.policy is PolicyName.HYBRID


def test_yaml_overrides_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("replicas:\n  count: 3\nengine:\n  max_num_seqs: 64\n")
    config = load_config(path)
    assert config.replicas.count == 3
    assert config.engine.max_num_seqs == 64
    assert config.engine.max_model_len == FleetConfig().engine.max_model_len


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("")
    assert load_config(path) == FleetConfig()


def test_unknown_key_is_named_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"engine": {"max_num_seq": 4}}, origin="fleet.yaml")
    text = str(err.value)
    assert "engine.max_num_seq: unknown field" in text
    assert "did you mean `max_num_seqs`" in text


def test_unknown_section_is_named() -> None:
    with pytest.raises(ConfigError, match=r"gatway: unknown field; did you mean `gateway`"):
        parse_config({"gatway": {}}, origin="fleet.yaml")


def test_bad_value_names_the_field_and_the_value() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"replicas": {"count": 0}}, origin="fleet.yaml")
    assert "replicas.count" in str(err.value)
    assert "(got 0)" in str(err.value)


def test_bad_enum_value_is_named() -> None:
    with pytest.raises(ConfigError, match=r"gateway.policy"):
        parse_config({"gateway": {"policy": "fastest"}}, origin="fleet.yaml")


def test_contradictory_knobs_are_refused() -> None:
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        parse_config(
            {"engine": {"enable_chunked_prefill": False, "max_num_batched_tokens": 512,
                        "max_model_len": 2048}},
            origin="fleet.yaml",
        )  # fmt: skip


def test_tensor_parallel_needs_gpus() -> None:
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        parse_config({"engine": {"tensor_parallel_size": 2}}, origin="fleet.yaml")
    gpu = parse_config(
        {"hardware": {"device": "gpu"}, "engine": {"tensor_parallel_size": 2}}, origin="x"
    )
    assert gpu.engine.tensor_parallel_size == 2


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("replicas:\n  count: [1\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load_config(path)


def test_missing_file_and_non_mapping_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml")
    path = tmp_path / "fleet.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(path)


def test_overrides_are_validated_like_the_file() -> None:
    config = FleetConfig().with_overrides({"replicas.count": 2, "gateway.port": 9000})
    assert (config.replicas.count, config.gateway.port) == (2, 9000)
    with pytest.raises(ConfigError, match=r"replicas\.count"):
        FleetConfig().with_overrides({"replicas.count": -1})
    with pytest.raises(ConfigError, match=r"  - --replicas \(replicas\.count\): Input should"):
        FleetConfig().with_overrides({"replicas.count": -1}, {"replicas.count": "--replicas"})


def test_every_field_is_documented() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                missing += walk(ann)
        return missing

    assert walk(FleetConfig) == []
