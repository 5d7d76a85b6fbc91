"""The PromQL the dashboard and the alert rules share, written against the series exactly as
the gateway (`servepilot_*`) and vLLM 0.32 (`vllm:*`, v1 engine) export them.

Latencies are quantiles of histogram rates over a window, never lifetime `_sum / _count`
(which a long-running replica flattens into a number that no longer moves).
"""

from __future__ import annotations

INFERENCE_ROUTES = 'route=~"/v1/(chat/)?completions"'
"""The gateway's `route` label values of the OpenAI inference routes."""


def quantile(q: float, histogram: str, window: str, by: str = "") -> str:
    """The q-quantile of `histogram`'s observations over the last `window`, grouped `by`."""
    groups = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({groups}) (rate({histogram}_bucket[{window}])))"


def request_rate(window: str, by: str = "code") -> str:
    """Inference requests answered per second by the gateway."""
    return f"sum by ({by}) (rate(servepilot_requests_total{{{INFERENCE_ROUTES}}}[{window}]))"


def shed_rate(window: str, by: str = "reason") -> str:
    return f"sum by ({by}) (rate(servepilot_shed_total[{window}]))"


def prefix_hit_rate(window: str) -> str:
    """Share of prompt tokens vLLM's prefix cache supplied, per replica."""
    hits = f"sum by (instance) (rate(vllm:prefix_cache_hits_total[{window}]))"
    queries = f"sum by (instance) (rate(vllm:prefix_cache_queries_total[{window}]))"
    return f"{hits} / {queries}"


def memory_growth_per_request(window: str) -> str:
    """Resident memory growth per answered request (bytes), per process: vLLM replicas count
    their finished requests, the gateway its answered inference requests. Processes with no
    requests in the window are left out (a model loading is not a leak)."""
    served = (
        f"sum by (instance) (rate(vllm:request_success_total[{window}])) or "
        f"sum by (instance) (rate(servepilot_requests_total{{{INFERENCE_ROUTES}}}[{window}]))"
    )
    return f"deriv(process_resident_memory_bytes[{window}]) / on (instance) (({served}) > 0)"
