"""Every manifest `servepilot k8s render` writes validates offline against the real schemas:
kubernetes-validate --strict for core kinds, the CRDs' published openAPIV3Schema for custom
kinds; `kubectl kustomize` renders the folder."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from servepilot.cli.main import main
from servepilot.core.errors import ConfigError
from servepilot.fleet.k8s import all_objects
from servepilot.fleet.k8s.files import write_files
from tests.unit.k8s_support import CRD_SCHEMAS, FLEETS, by_kind, fleet, rendered, validate

VARIANTS = [
    (name, overrides)
    for name in FLEETS
    for overrides in ({}, {"autoscaling": {"autoscaler": "keda"}})
] + [(name, {"runtime": "ray"}) for name in ("deepseek-h200", "two-node")]


@pytest.mark.parametrize(("name", "overrides"), VARIANTS)
def test_every_object_validates_against_its_schema(name: str, overrides: dict[str, object]) -> None:
    files = rendered(fleet(FLEETS[name], **overrides))
    objects = all_objects(files)
    assert objects
    for obj in objects:
        validate(obj)


def test_every_kind_emitted_has_a_schema_it_is_checked_against() -> None:
    emitted = {
        (obj["apiVersion"], obj["kind"])
        for name, overrides in VARIANTS
        for obj in all_objects(rendered(fleet(FLEETS[name], **overrides)))
    }
    assert set(CRD_SCHEMAS) <= emitted  # every vendored CRD schema is used
    core = emitted - set(CRD_SCHEMAS)
    assert ("autoscaling/v2", "HorizontalPodAutoscaler") in core
    assert ("policy/v1", "PodDisruptionBudget") in core


def test_a_misspelt_field_fails_validation_core_and_crd() -> None:
    files = rendered(fleet(FLEETS["two-node"]))
    deployment = dict(by_kind(rendered(fleet(FLEETS["embedded"])), "Deployment")[0])
    deployment["spec"] = {**deployment["spec"], "replica": 2}
    with pytest.raises(Exception, match="replica"):
        validate(deployment)
    lws = dict(by_kind(files, "LeaderWorkerSet")[0])
    lws["spec"] = {**lws["spec"], "leaderWorkerTemplte": {}}
    with pytest.raises(jsonschema.ValidationError):
        validate(lws)


def test_the_three_fleets_choose_their_workload() -> None:
    assert by_kind(rendered(fleet(FLEETS["embedded"])), "Deployment")
    single = rendered(fleet(FLEETS["deepseek-h200"]))
    assert not by_kind(single, "LeaderWorkerSet")
    (lws,) = by_kind(rendered(fleet(FLEETS["two-node"])), "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2  # TP8 x PP2 on 8-GPU nodes: two pods of 8 GPUs
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "--pipeline-parallel-size 2" in leader["command"][-1]


def _flags(argv: list[str]) -> list[str]:
    """A server command with its model (a hub repository, a folder in the volume) left out."""
    model = argv.index("--model") + 1 if "--model" in argv else 2
    return argv[:model] + argv[model + 1 :]


@pytest.mark.parametrize("name", ["deepseek-h200", "embedded"])
def test_the_pods_run_the_command_plan_prints_knob_for_knob(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The README's fleet: plan derives max_num_seqs, max_num_batched_tokens and chunked
    # prefill (and sizes the HPA on them); the pods must run them, not vLLM's defaults.
    source = tmp_path / "fleet.yaml"
    source.write_text(yaml.safe_dump(FLEETS[name]))
    assert main(["plan", "-c", str(source), "--json"]) == 0
    printed = shlex.split(json.loads(capsys.readouterr().out)["vllm_command"])
    assert main(["k8s", "render", "-c", str(source), "--out", str(tmp_path / "k8s")]) == 0
    objects = yaml.safe_load_all((tmp_path / "k8s" / "vllm.yaml").read_text())
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert _flags(container["command"]) == _flags(printed)
    if name == "deepseek-h200":
        assert "--max-num-seqs 256 --max-num-batched-tokens 8192 --enable-chunked-prefill" in (
            " ".join(container["command"])
        )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("name", list(FLEETS))
def test_kubectl_kustomize_renders_the_written_folder(name: str, tmp_path: Path) -> None:
    source = tmp_path / "fleet.yaml"
    source.write_text(yaml.safe_dump(FLEETS[name]))
    out = tmp_path / "manifests"
    assert main(["k8s", "render", "-c", str(source), "--out", str(out), "--namespace", "llm"]) == 0
    result = subprocess.run(
        ["kubectl", "kustomize", str(out)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    namespaced = [o for o in objects if o["kind"] not in ("Namespace", "PriorityClass")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"llm"}
    assert len(objects) == len(all_objects(rendered(fleet(FLEETS[name], namespace="llm"))))


def test_a_render_into_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "k8s").write_text("mine")
    with pytest.raises(ConfigError, match=r"--out .*k8s is a file, not a folder"):
        write_files((), tmp_path / "k8s")
    assert (tmp_path / "k8s").read_text() == "mine"


def test_a_render_into_the_same_folder_leaves_no_file_of_the_previous_one(tmp_path: Path) -> None:
    source = tmp_path / "fleet.yaml"
    source.write_text(yaml.safe_dump(FLEETS["deepseek-h200"]))
    out = tmp_path / "k8s"
    (tmp_path / "k8s").mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["k8s", "render", "-c", str(source), "--out", str(out)]) == 0
    assert (out / "vllm.yaml").exists() and (out / "autoscaling.yaml").exists()
    assert main(["k8s", "render", "-c", str(source), "--out", str(out), "--runtime", "ray"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "gateway.yaml", "kustomization.yaml", "monitoring.yaml", "namespace.yaml", "notes.txt",
        "priorityclasses.yaml", "rayservice.yaml",
    ]  # fmt: skip
