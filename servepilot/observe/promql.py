"""The PromQL the dashboard and the alert rules share, written against the series exactly as
the gateway (`servepilot_*`) and vLLM 0.32 (`vllm:*`, v1 engine) export them.

Latencies are quantiles of histogram rates over a window, never lifetime `_sum / _count`
(which a long-running replica flattens into a number that no longer moves).

`scope` is extra label matchers (`namespace="llm"`) put in every selector, so that one
Prometheus watching several fleets (a cluster's namespaces) evaluates each on its own series.
"""

from __future__ import annotations

from collections.abc import Mapping

GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
"""The gateway's `route` label values of the routes that generate text: their requests are
the ones counted as served, and the latency judged (a pooling call has no TTFT, and an E2E of
its own; the gateway's latency histograms leave tokenizer calls out altogether)."""
INFERENCE_ROUTES = f'route=~"{"|".join(GENERATION_ROUTES)}"'
"""A matcher of the `route` label for `GENERATION_ROUTES`."""


def on_inference_routes(scope: str = "") -> str:
    """`scope`'s matchers and the inference routes' (for a gateway latency histogram)."""
    return ",".join(c for c in (INFERENCE_ROUTES, scope) if c)


def matchers(labels: Mapping[str, str]) -> str:
    """Equality matchers of `labels` as PromQL writes them: `namespace="llm",job="x"`."""
    return ",".join(f'{name}="{_escaped(value)}"' for name, value in labels.items())


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(metric: str, *conditions: str) -> str:
    """`metric{c1,c2}`, or the bare name when every condition is empty."""
    inner = ",".join(c for c in conditions if c)
    return f"{metric}{{{inner}}}" if inner else metric


def quantile(q: float, histogram: str, window: str, by: str = "", scope: str = "") -> str:
    """The q-quantile of `histogram`'s observations over the last `window`, grouped `by`."""
    groups = f"{by}, le" if by else "le"
    buckets = selector(f"{histogram}_bucket", scope)
    return f"histogram_quantile({q}, sum by ({groups}) (rate({buckets}[{window}])))"


def request_rate(window: str, by: str = "code") -> str:
    """Inference requests answered per second by the gateway."""
    return f"sum by ({by}) (rate(servepilot_requests_total{{{INFERENCE_ROUTES}}}[{window}]))"


def shed_rate(window: str, by: str = "reason", scope: str = "") -> str:
    return f"sum by ({by}) (rate({selector('servepilot_shed_total', scope)}[{window}]))"


def prefix_hit_rate(window: str) -> str:
    """Share of prompt tokens vLLM's prefix cache supplied, per replica."""
    hits = f"sum by (instance) (rate(vllm:prefix_cache_hits_total[{window}]))"
    queries = f"sum by (instance) (rate(vllm:prefix_cache_queries_total[{window}]))"
    return f"{hits} / {queries}"


def memory_growth_per_request(window: str, scope: str = "") -> str:
    """Resident memory growth per answered request (bytes), per process: vLLM replicas count
    their finished requests, the gateway its answered inference requests. Processes with no
    requests in the window are left out (a model loading is not a leak)."""
    finished = selector("vllm:request_success_total", scope)
    answered = selector("servepilot_requests_total", INFERENCE_ROUTES, scope)
    served = (
        f"sum by (instance) (rate({finished}[{window}])) or "
        f"sum by (instance) (rate({answered}[{window}]))"
    )
    memory = selector("process_resident_memory_bytes", scope)
    return f"deriv({memory}[{window}]) / on (instance) (({served}) > 0)"
