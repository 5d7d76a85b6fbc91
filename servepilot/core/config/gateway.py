"""The gateway's section of fleet.yaml: routing, admission, protection, API keys and the
access log.

Defaults follow the seeds where they give a number (8k-token shard boundary, 10% dynamic
compensation, the 25 ms hard limit shedding 5% of the lowest class, 95% saturation for 30 s)
and otherwise what works on a 2-core machine.
"""

from __future__ import annotations

import enum
import os

from pydantic import Field, model_validator

from servepilot.core.config.batch import BatchConfig
from servepilot.core.config.section import Section as _Section


class PolicyName(enum.StrEnum):
    ROUND_ROBIN = "round_robin"
    LEAST_LOAD = "least_load"
    PREFIX_AFFINITY = "prefix_affinity"
    SESSION = "session"
    LENGTH_SHARD = "length_shard"
    HYBRID = "hybrid"
    PREDICTED_LATENCY = "predicted_latency"


class Priority(enum.IntEnum):
    """Request classes (X-Priority header or the API key's class); lower is more urgent."""

    P0 = 0
    """Interactive: a user waits for the answer."""
    P1 = 1
    """Default."""
    P2 = 2
    """Batch or background work: shed first under pressure."""


class RoutingConfig(_Section):
    prefix_block_chars: int = Field(default=256, ge=16)
    """Granularity of prefix matching: the prompt (chat history included) is hashed in blocks
    of this many characters, each hash covering everything before it."""

    prefix_max_blocks: int = Field(default=64, ge=1)
    """Blocks hashed per request at most (the first 64 x 256 characters by default)."""

    prefix_table_blocks: int = Field(default=200_000, ge=1)
    """Prefix blocks remembered across all replicas (least recently used forgotten first)."""

    balance_epsilon: float = Field(default=0.25, ge=0.0)
    """Bounded load: a replica whose load is above (1 + epsilon) x the mean is skipped by
    prefix_affinity and session routing, so a popular prefix cannot make a hotspot."""

    session_ttl_s: float = Field(default=1800.0, gt=0)
    """How long an X-Session-Id stays bound to its replica after its last request."""

    session_table_size: int = Field(default=100_000, ge=1)
    """Sessions remembered at most (least recently used forgotten first)."""

    length_boundary_tokens: int = Field(default=8192, ge=1)
    """length_shard / hybrid: prompts of at least this many tokens go to the long group."""

    long_group_share: float = Field(default=0.5, gt=0.0, lt=1.0)
    """Share of the replicas (at least one, when there are two or more) in the long group."""

    group_idle_s: float = Field(default=60.0, gt=0)
    """length_shard / hybrid: a group that has had no prompts of its own for this long lends
    its replicas to the other group, so that short-only traffic uses every replica."""

    compensation_max_share: float = Field(default=0.10, ge=0.0, le=1.0)
    """Dynamic compensation: the largest share of a group's traffic that may be moved to the
    other group when that one is less loaded."""

    chars_per_token: float = Field(default=4.0, gt=0)
    """Estimate of prompt tokens from its length in characters (routing does not tokenize)."""

    ttft_target_ms: tuple[float, float, float] = (1_000.0, 2_000.0, 30_000.0)
    """predicted_latency: the time to first token P0, P1, P2 requests are routed to meet; with
    tpot_target_ms, it also sets how much a millisecond of one weighs against the other."""

    tpot_target_ms: tuple[float, float, float] = (100.0, 200.0, 1_000.0)
    """predicted_latency: the time per output token P0, P1, P2 requests are routed to meet."""

    step_profile: str | None = None
    """predicted_latency under `up`: the replicas' step times, a profile from `servepilot
    calibrate` (servepilot.costmodel/v1) or `servepilot profile` (a GPU's operators). None:
    engine.sim_profile for simulated replicas, else the roofline of the model on
    hardware.accelerator."""

    @model_validator(mode="after")
    def _targets_positive(self) -> RoutingConfig:
        if any(ms <= 0 for ms in self.ttft_target_ms + self.tpot_target_ms):
            raise ValueError("ttft_target_ms, tpot_target_ms: every class's target must be > 0")
        return self


class KvIndexConfig(_Section):
    tokenizer: str | None = None
    """A Hugging Face folder with the served model's tokenizer: the gateway tokenises each
    prompt with it to look it up in the exact index its replicas' KV events keep. None (or
    a replica that publishes no events): prefix affinity guesses from the prompt's text.
    `up` sets it to the model's folder."""

    block_size: int = Field(default=16, ge=1)
    """Tokens per KV block of the replicas (vLLM's --block-size: 16 on GPUs, 128 on CPU by
    default); `up` sets it from the fleet. A replica whose events carry another size is
    guessed."""

    hash_seed: str = "vllm-none-hash"
    """The hash seed of vLLM's first block hash: the replicas' PYTHONHASHSEED if they have one,
    else vLLM's fixed default."""

    token_cache_chars: int = Field(default=4_000_000, ge=0)
    """Characters of prompt segments whose tokens the gateway keeps, so a conversation's
    earlier turns are not tokenised again (least recently used forgotten first)."""


class AdmissionConfig(_Section):
    replica_concurrency: int = Field(default=256, ge=1)
    """Requests in flight per replica at most when its budget is not known from the fleet
    (the fleet derives it from max_num_seqs and the KV capacity)."""

    tokens_per_request: int = Field(default=1024, ge=1)
    """Typical prompt + output tokens of one request: the fleet turns a replica's KV capacity
    into a concurrency budget with it (budget = min(max_num_seqs, KV tokens / this))."""

    kv_full_usage: float = Field(default=0.95, gt=0.0, le=1.0)
    """A replica at or above this KV cache usage (scraped) gets no new request until it drains."""

    queue_budget_ms: tuple[float, float, float] = (2_000.0, 10_000.0, 30_000.0)
    """Longest queue wait for P0, P1, P2; a request that would wait longer is shed with 429."""

    aging_s: float = Field(default=10.0, gt=0)
    """A queued request moves up one class for every this many seconds it has waited, so batch
    work never starves."""

    max_queued: int = Field(default=10_000, ge=0)
    """Requests queued in the gateway at most; beyond, new ones get 429."""

    cold_start_wait_s: float = Field(default=60.0, ge=0)
    """While no replica is ready (start-up, scale-up), requests wait this long before 503."""

    fair_shares: bool = True
    """Within a class, tenants (an API key's `tenant`, else the key itself) take weighted fair
    turns at the queue, so one tenant's flood cannot starve another's requests of the same
    class; false: one first-come-first-served queue per class."""

    tenant_weights: dict[str, float] = Field(default_factory=dict)
    """Fair-share weight per tenant (a tenant not named here weighs 1.0): with weights 3 and 1
    and both tenants waiting, three requests of the first go for every one of the second."""

    @model_validator(mode="after")
    def _budgets_positive(self) -> AdmissionConfig:
        if any(budget <= 0 for budget in self.queue_budget_ms):
            raise ValueError("queue_budget_ms: every class's budget must be > 0")
        if any(weight <= 0 for weight in self.tenant_weights.values()):
            raise ValueError("tenant_weights: every weight must be > 0")
        return self


class ProtectionConfig(_Section):
    breaker_failures: int = Field(default=5, ge=1)
    """Consecutive errors or timeouts of a replica that open its circuit breaker."""

    breaker_open_s: float = Field(default=10.0, gt=0)
    """How long an open breaker stays open before one half-open probe request is let through."""

    hard_limit_ttfb_ms: float = Field(default=25.0, gt=0)
    """Hard limit: when a replica's upstream time to first byte (median of recent streamed
    requests) passes this, a share of the lowest class is shed."""

    hard_limit_shed_share: float = Field(default=0.05, ge=0.0, le=1.0)
    """Share of lowest-class (P2) requests shed while the hard limit is crossed."""

    soft_limit_kv_usage: float = Field(default=0.95, gt=0.0, le=1.0)
    """Soft limit: the fleet is saturated when its mean KV cache usage is at least this..."""

    soft_limit_queue_per_replica: float = Field(default=8.0, gt=0)
    """...or when requests queued (gateway plus vLLM waiting) per ready replica reach this."""

    soft_limit_sustain_s: float = Field(default=30.0, gt=0)
    """Saturation sustained this long steps degradation up (shed P2, then cap P1's max_tokens);
    this long without it steps back down."""

    degraded_max_tokens: int = Field(default=256, ge=1)
    """max_tokens cap for P1 requests at the second degradation step."""


class ApiKey(_Section):
    name: str
    """Label in metrics and logs (the key itself is never logged)."""

    key: str | None = Field(default=None, min_length=1)
    """The bearer token; prefer `key_env`, which keeps it out of the file."""

    key_env: str | None = None
    """Environment variable holding the bearer token."""

    priority: Priority = Priority.P1
    """Class of this key's requests (an X-Priority header may only lower it)."""

    tenant: str | None = Field(default=None, min_length=1)
    """Who the key's requests count for in the fair shares of the queue (keys of one team
    share one tenant); unset: the key is its own tenant, named by its `name`."""

    rate_per_s: float | None = Field(default=None, gt=0)
    """Token-bucket rate limit in requests per second; None is unlimited."""

    burst: int = Field(default=10, ge=1)
    """Requests the bucket lets through at once."""

    @model_validator(mode="after")
    def _one_source(self) -> ApiKey:
        if (self.key is None) == (self.key_env is None):
            raise ValueError(f"api key {self.name!r}: set exactly one of `key` or `key_env`")
        return self

    @property
    def tenant_id(self) -> str:
        """The tenant its requests count for."""
        return self.name if self.tenant is None else self.tenant

    def secret(self) -> str:
        """The bearer token (read from the environment for `key_env`)."""
        if self.key is not None:
            return self.key
        assert self.key_env is not None
        value = os.environ.get(self.key_env)
        if not value:
            raise ValueError(f"api key {self.name!r}: environment variable {self.key_env} is unset")
        return value


class AuthConfig(_Section):
    keys: tuple[ApiKey, ...] = ()
    """Accepted API keys. Empty: no authentication (any client may call)."""

    admin_key_env: str | None = None
    """Environment variable holding the key the /admin routes require. When keys are set and
    this is not, the /admin routes are closed."""


class AccessLogConfig(_Section):
    enabled: bool = True
    """Write one JSON line per request (time, method, path, status, replica, class, sizes,
    TTFB/TTFT/E2E, error); `servepilot up` writes it to access.log in the run folder, next to
    gateway.log; `servepilot gateway` only with --access-log PATH (or `path`)."""

    path: str | None = None
    """File to append the lines to; unset: the run folder's access.log under `up`, none for
    `servepilot gateway` without --access-log."""

    sample_rate: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of answered requests (status < 400) that get a line, evenly spread (0.1: every
    tenth); errors, 429s and 503s included, always get one."""

    flush_interval_ms: float = Field(default=500.0, gt=0)
    """Lines are held in memory and written by one background task this often..."""

    flush_lines: int = Field(default=1000, ge=1)
    """...or as soon as this many are waiting, whichever comes first."""

    buffer_lines: int = Field(default=20_000, ge=1)
    """Lines held in memory at most; past it new lines are dropped and counted
    (servepilot_access_log_dropped_total): a slow disk never slows the requests."""


class ContinuationConfig(_Section):
    enabled: bool = True
    """When a replica fails after it began streaming an answer (connection reset, end of
    the body before the last event, a stall, taken out of rotation), send the rest of the
    generation to another healthy replica and keep relaying it as the same answer. A
    request opts out with the header `X-Servepilot-Continue: 0`."""

    max_continuations: int = Field(default=2, ge=0)
    """Continuations of one request at most; past them the stream ends with an error event."""

    whole_answers: bool = False
    """Continue non-streamed answers too: a plain non-streamed completion or chat (one
    choice, no tools, logprobs or echo) is asked of the replica as a stream, and the gateway
    answers with the whole answer it assembled from it. Costs the gateway a JSON parse per
    token, and the replicas' time to first byte of such requests becomes a stream's (the
    hard limit reads it). Off: non-streamed answers are passed on as the replica wrote them,
    and one whose replica fails is retried from the start."""

    replica_wait_s: float = Field(default=60.0, ge=0)
    """A stream to continue when no other replica is in rotation (all down, or restarting)
    waits this long for one to come back (a health check passing, a replica joining), its
    client seeing a pause, before it ends with the error event. 0: it ends at once."""

    stall_timeout_s: float = Field(default=30.0, gt=0)
    """A stream that has relayed its first token and then gets nothing from its replica for
    this long is given up on that replica and continued elsewhere (within this long of its
    last byte and at most 0.1 s before: the watchdog ticks every tenth of a second and sees
    that a byte came, not when), and the replica is taken out of
    rotation until a health check passes (its engine makes no step: its streams still waiting
    for a first token go elsewhere at once). A replica taken out of rotation (failed health
    checks) has its streams continued elsewhere too."""


class GatewayConfig(_Section):
    host: str = "127.0.0.1"
    """Address the gateway listens on."""

    port: int = Field(default=8000, ge=0, le=65535)
    """Port the gateway listens on (0 picks a free one)."""

    policy: PolicyName = PolicyName.HYBRID
    """Routing policy: round_robin, least_load, prefix_affinity, session, length_shard,
    hybrid (length sharding + dynamic compensation + prefix affinity) or predicted_latency
    (each replica's predicted TTFT and TPOT against the request's class targets, from its
    step-time model). See docs/gateway.md."""

    health_interval_s: float = Field(default=2.0, gt=0)
    """How often each replica's /health is checked (and its /metrics scraped)."""

    unhealthy_after: int = Field(default=2, ge=1)
    """Consecutive failed checks (or failed requests) that take a replica out of rotation."""

    connect_timeout_s: float = Field(default=5.0, gt=0)
    """Time allowed to open a connection to a replica."""

    request_timeout_s: float = Field(default=600.0, gt=0)
    """Time allowed for a whole upstream request."""

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest request body accepted; larger ones get 413."""

    retry_after_s: int = Field(default=2, ge=1)
    """Retry-After sent with 429 and 503."""

    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    """Knobs of the routing policies."""

    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    """Per-class queues, replica budgets and shedding."""

    protection: ProtectionConfig = Field(default_factory=ProtectionConfig)
    """Circuit breakers, hard and soft limits."""

    auth: AuthConfig = Field(default_factory=AuthConfig)
    """API keys and the admin key."""

    access_log: AccessLogConfig = Field(default_factory=AccessLogConfig)
    """The access log: one line per request, written off the request path."""

    batch: BatchConfig = Field(default_factory=BatchConfig)
    """The OpenAI Files and Batch API: its store, file limit and concurrency."""

    kv_index: KvIndexConfig = Field(default_factory=KvIndexConfig)
    """The exact index of the replicas' prefix caches, from their KV events."""

    continuation: ContinuationConfig = Field(default_factory=ContinuationConfig)
    """Streams continued on another replica when theirs fails mid-answer."""
