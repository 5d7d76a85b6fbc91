"""`up` launches the engine `plan` prints for the same fleet.yaml (issue 39: pods and local
replicas ran vLLM's defaults while plan sized the fleet on its own knobs): knob for knob, the
replica's command line is plan's, whatever the file leaves out; a knob the file sets is kept;
a fleet plan cannot size starts as the file says, with a note."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from servepilot.cli.main import main
from servepilot.core.config import FleetConfig, load_config
from servepilot.engine.args import KvEventsPorts
from servepilot.engine.model_source import ResolvedModel
from servepilot.fleet.detach import write_fleet_yaml
from servepilot.fleet.launched import launched_fleet
from servepilot.fleet.replica_launch import replica_command

FLEETS = {
    "embedded": {},
    "llama-h200": {
        "model": {"source": "llama-3.1-8b", "weights": "dummy"},
        "hardware": {"device": "gpu", "accelerator": "h200-141", "count": 1},
        "engine": {"max_model_len": 8192},
    },
}


def _options(argv: list[str]) -> dict[str, str]:
    """A vLLM command's options from --served-model-name on, without where it listens."""
    start = argv.index("--served-model-name")
    options: dict[str, str] = {}
    for i, word in enumerate(argv[start:], start):
        if word.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            options[word] = "" if nxt.startswith("--") else nxt
    return {k: v for k, v in options.items() if k not in ("--host", "--port")}


@pytest.mark.parametrize("name", list(FLEETS))
def test_a_replica_runs_the_command_plan_prints(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "fleet.yaml"
    source.write_text(yaml.safe_dump(FLEETS[name]))
    assert main(["plan", "-c", str(source), "--json"]) == 0
    printed = _options(shlex.split(json.loads(capsys.readouterr().out)["vllm_command"]))
    launched = launched_fleet(FleetConfig.model_validate(FLEETS[name]))
    assert launched.note is None
    model = ResolvedModel(tmp_path, printed["--served-model-name"], dummy=name != "embedded")
    # Its KV events go to ports of its own, as its HTTP does; plan prints vLLM's defaults.
    ports = KvEventsPorts()
    command = replica_command(launched.config, model, "127.0.0.1", 8001, (0,), ports)
    assert _options(command.argv) == printed
    assert "--max-num-seqs" in printed and "--max-num-batched-tokens" in printed


def test_a_knob_the_file_sets_is_kept() -> None:
    config = FleetConfig.model_validate({"engine": {"max_num_seqs": 7, "max_model_len": 1024}})
    engine = launched_fleet(config).config.engine
    assert (engine.max_num_seqs, engine.max_model_len) == (7, 1024)


def test_a_fleet_plan_cannot_size_starts_as_the_file_says(tmp_path: Path) -> None:
    folder = tmp_path / "odd-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["NoSuchModel"]}))
    config = FleetConfig.model_validate({"model": {"source": str(folder)}})
    launched = launched_fleet(config)
    assert launched.config == config
    assert launched.note is not None and launched.note.startswith("`plan` cannot size")


def test_a_detached_up_runs_the_same_engine(tmp_path: Path) -> None:
    # `up --detach` hands its fleet to a background `up` through a file: written whole, every
    # field read back as given, and the default fleet ran max_model_len 2,048 where `up` in the
    # foreground and `plan` run 3,072.
    config = FleetConfig.model_validate({"replicas": {"count": 1}, "gateway": {"port": 8123}})
    written = tmp_path / "fleet.yaml"
    write_fleet_yaml(config, written)
    again = load_config(written)
    assert again == config
    engine = launched_fleet(again).config.engine
    assert engine == launched_fleet(config).config.engine
    assert engine.max_model_len == 3072
