"""Extract a CRD's openAPIV3Schema (one version) into compact JSON test data.

    python tests/data/crds/vendor.py CRD.yaml VERSION OUT.json

Descriptions are dropped (they are most of a CRD's bytes and do not validate anything); every
other keyword is kept as published. See README.md here for each file's source.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml


def strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def main(crd_path: str, version: str, out_path: str) -> None:
    crd = yaml.safe_load(Path(crd_path).read_text())
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = strip_descriptions(found["schema"]["openAPIV3Schema"])
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    Path(out_path).write_text(text + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
