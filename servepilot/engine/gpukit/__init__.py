"""The GPU bring-up kit: a pinned wheelhouse per vLLM version, built here and installed offline.

`pins/vllm-<version>.txt` lists every wheel a target lacks (name==version with its sha256);
`build` downloads exactly those, checks their hashes and dependencies and splits the whole into
parts small enough for one transfer each; `install.py`, copied beside the parts, reassembles,
verifies and installs them on the target with the standard library alone. docs/gpu.md is the
sequence. Never part of `make test`: it downloads hundreds of megabytes.
"""
