"""Where servepilot keeps files: converted models (cache) and running fleets (state)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Converted models and other rebuildable data. `SERVEPILOT_CACHE` overrides."""
    if env := os.environ.get("SERVEPILOT_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servepilot"


def state_dir() -> Path:
    """Records of running fleets and replica logs. `SERVEPILOT_STATE` overrides."""
    if env := os.environ.get("SERVEPILOT_STATE"):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "servepilot"
