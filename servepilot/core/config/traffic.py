"""fleet.yaml's `traffic` section: the load `plan` sizes the deployment for."""

from __future__ import annotations

from pydantic import Field

from servepilot.core.config.section import Section as _Section


class TrafficConfig(_Section):
    """The traffic the deployment must carry, for `plan` (sizes are in tokens)."""

    input_tokens: int = Field(default=512, ge=1)
    """Mean prompt length."""

    output_tokens: int = Field(default=256, ge=1)
    """Mean output length."""

    max_input_tokens: int | None = Field(default=None, ge=1)
    """Longest prompt to serve; with max_output_tokens it sets max_model_len when that is
    not given. None: 4 x the mean."""

    max_output_tokens: int | None = Field(default=None, ge=1)
    """Longest output to serve. None: 4 x the mean."""

    target_qps: float | None = Field(default=None, gt=0)
    """Requests per second to sustain. None: not known."""

    concurrency: int | None = Field(default=None, ge=1)
    """Requests in flight to hold at once. None: not known."""

    bursty: bool = False
    """Traffic comes in bursts (peaks well above the mean), which favours autoscaling."""
