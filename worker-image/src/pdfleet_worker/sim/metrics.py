"""vLLM 0.33's Prometheus metrics: family names, types, label names, buckets and HELP text.

Where it fits: the simulator's /metrics. The autoscaler's PromQL, the drain logic and the
router's engine discovery (it counts `engine=` labels) read these exactly as they would from
vLLM's v1 PrometheusStatLogger, and e2e/scenarios/differential.py compares the families with a real
engine's page. Counters get `_total` and every counter and histogram a `_created` series on
the wire, as prometheus_client writes them for vLLM. Times are simulated seconds (wall
seconds / --time-scale).

Which families exist follows vLLM's rules: the NixlConnector's `vllm:nixl_*` only with a KV
connector configured, `vllm:num_requests_kv_fetch_by_stage` only on a KV consumer
(`kv_consumer` or `kv_both`).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase

# vLLM answers /metrics with prometheus_client's latest text format whatever the Accept
# header says: "text/plain; version=1.0.0; charset=utf-8" with prometheus_client 0.26, which
# vLLM's install and this one share.
CONTENT_TYPE = CONTENT_TYPE_LATEST

TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
ITL_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
REQUEST_LATENCY_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
# nixl/stats.py: the post time starts at 1 ms, the transfer time at 5 ms (the same list
# without its first bucket); bytes 2^(10+i) for i = 1, 3, ..., 23.
NIXL_POST_TIME_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1),
    *(0.2, 0.3, 0.5, 0.75, 1.0, 5.0),
)
NIXL_XFER_TIME_BUCKETS = NIXL_POST_TIME_BUCKETS[1:]
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 24, 2))
NIXL_DESCRIPTORS_BUCKETS = (
    *(10, 20, 30, 50, 75, 100, 200, 400),
    *(1000, 2000, 4000, 10000, 20000, 50000),
)

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS = ("capacity", "deferred")
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
KV_CONSUMER_ROLES = ("kv_consumer", "kv_both")


#: vLLM's default bounds of its fixed histogram bucket families (v1/metrics/buckets.py).
STATIC_FAMILY_BUCKETS: dict[str, tuple[float, ...]] = {
    "request_latency": REQUEST_LATENCY_BUCKETS,
    "time_to_first_token": TTFT_BUCKETS,
    "inter_token_latency": ITL_BUCKETS,
    "iteration_tokens": ITERATION_TOKEN_BUCKETS,
    "request_params_n": REQUEST_PARAMS_N_BUCKETS,
    "request_num_preemptions": REQUEST_PREEMPTIONS_BUCKETS,
}
#: The keys of `--custom-histogram-buckets`: those, the token counts (a 1-2-5 series up to
#: the context length) and KV cache residency, of which the simulator has no histograms.
BUCKET_FAMILIES = (*STATIC_FAMILY_BUCKETS, "request_tokens", "kv_cache_residency")

HistogramBuckets = Mapping[str, tuple[float, ...]]
"""Bucket bounds by family, replacing that family's defaults (`--custom-histogram-buckets`)."""


def parse_histogram_buckets(text: str) -> dict[str, tuple[float, ...]]:
    """`--custom-histogram-buckets` as vLLM reads it (config/observability.py): a JSON map
    from a known family to non-empty, strictly increasing, finite, positive bounds.
    ValueError naming the family and the bound otherwise."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"custom_histogram_buckets: not JSON: {err}") from None
    if not isinstance(raw, dict):
        raise ValueError("custom_histogram_buckets: must be a JSON object")
    out: dict[str, tuple[float, ...]] = {}
    for family, bounds in raw.items():
        where = f"custom_histogram_buckets[{family!r}]"
        if family not in BUCKET_FAMILIES:
            raise ValueError(
                f"custom_histogram_buckets: unknown bucket family {family!r}; "
                f"known families: {sorted(BUCKET_FAMILIES)}"
            )
        if not isinstance(bounds, list) or not bounds:
            raise ValueError(f"{where}: bucket list must not be empty")
        for bound in bounds:
            if isinstance(bound, bool) or not isinstance(bound, int | float):
                raise ValueError(f"{where}: bound {bound!r} must be a number")
            if not math.isfinite(bound) or bound <= 0:
                raise ValueError(f"{where}: bound {bound!r} must be finite and greater than 0")
        if any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"{where}: bounds {bounds} must be strictly increasing")
        out[family] = tuple(float(b) for b in bounds)
    return out


def request_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to max_model_len (build_1_2_5_buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_model_len:
                return tuple(out)
            out.append(float(v))
        exponent += 1


@dataclass(frozen=True)
class SchedulerState:
    """What vLLM's SchedulerStats hands the gauges, read from the engine at scrape time.

    `waiting_by_reason` sums to the waiting gauge: vLLM sets `vllm:num_requests_waiting` to
    capacity + deferred (a decode request whose KV is being pulled is deferred)."""

    running: int
    waiting_by_reason: Mapping[str, int]
    kv_fetch_by_stage: Mapping[str, int]
    kv_usage: float


@dataclass(frozen=True)
class FirstToken:
    """A request's prompt accounting, recorded when its first token comes out."""

    ttft: float
    prompt_tokens: int
    external_tokens: int  # loaded from a prefill engine instead of computed
    max_tokens: int


@dataclass(frozen=True)
class FinishedRequest:
    """vLLM's FinishedRequestStats: what a finished request adds to the histograms."""

    reason: str
    e2e: float
    queued: float
    prefill: float
    inference: float
    decode: float
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    preemptions: int
    mean_time_per_output_token: float


@dataclass(frozen=True)
class Transfer:
    """One finished NIXL READ on the decode side (nixl/stats.py record_transfer)."""

    post_s: float
    xfer_s: float
    num_bytes: float
    descriptors: int


_Metric = TypeVar("_Metric", bound=MetricWrapperBase)


def _count_of(
    state: Callable[[], SchedulerState],
    counts: Callable[[SchedulerState], Mapping[str, int]],
    label: str,
) -> Callable[[], float]:
    """A gauge function: one label's count in the engine's state at scrape time."""
    return lambda: float(counts(state()).get(label, 0))


class EngineMetrics:
    """The metric families of one engine (`engine` label = DP rank, "0" for DP=1).

    `kv_role` is the KV connector's role, None without a connector; `cache_info` becomes the
    labels of `vllm:cache_config_info` (engine-specific CacheConfig fields)."""

    def __init__(
        self,
        model_name: str,
        engine: str = "0",
        max_model_len: int = 131072,
        kv_role: str | None = None,
        cache_info: Mapping[str, str] | None = None,
        histogram_buckets: HistogramBuckets | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.kv_role = kv_role
        self._lv = {"model_name": model_name, "engine": engine}
        self._buckets = {
            **STATIC_FAMILY_BUCKETS,
            "request_tokens": request_token_buckets(max_model_len),
            **(histogram_buckets or {}),
        }
        self._build_scheduler_gauges()
        self._build_counters()
        self._build_histograms()
        self._build_nixl()
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],  # a frontend metric: no engine label
            registry=self.registry,
        )
        for reason in ADMISSION_REASONS:
            rejections.labels(model_name=model_name, reason=reason)
        info = {**(cache_info or {}), "engine": engine}
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(info),
            registry=self.registry,
        ).labels(**info).set(1)

    # ----- registration helpers --------------------------------------------------------

    def _one(
        self, cls: type[_Metric], name: str, doc: str, register: bool = True, **kw: object
    ) -> _Metric:
        """The engine's single series of a family (labels model_name, engine); one that is
        not registered records but is not served."""
        registry = self.registry if register else None
        family = cls(name, doc, list(self._lv), registry=registry, **kw)  # type: ignore[arg-type]
        return family.labels(**self._lv)

    def _by(
        self, cls: type[_Metric], name: str, doc: str, label: str, values: tuple[str, ...]
    ) -> dict[str, _Metric]:
        """One series per value of an extra label, all created up front as vLLM does."""
        family = cls(name, doc, [*self._lv, label], registry=self.registry)
        return {v: family.labels(**self._lv, **{label: v}) for v in values}

    def _hist(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return self._one(Histogram, name, doc, buckets=buckets)

    # ----- families ------------------------------------------------------------------------

    def _build_scheduler_gauges(self) -> None:
        self.running = self._one(
            Gauge, "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = self._one(
            Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.waiting_by_reason = self._by(
            Gauge,
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
            "budget, KV transfer, blocked status). Sum of all reasons equals "
            "vllm:num_requests_waiting.",
            "reason",
            WAITING_REASONS,
        )
        self.kv_fetch_by_stage: dict[str, Gauge] = {}
        if self.kv_role in KV_CONSUMER_ROLES:
            self.kv_fetch_by_stage = self._by(
                Gauge,
                "vllm:num_requests_kv_fetch_by_stage",
                "Number of waiting requests by async KV load stage. Stage labels: "
                "'waiting_to_start' = needs an async KV load that has not started; "
                "'in_progress' = load started and not yet reported finished; "
                "'completed_waiting' = load finished, request not running yet.",
                "stage",
                KV_FETCH_STAGES,
            )
        sleep = self._by(
            Gauge,
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
            "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
            "sleep level 2.",
            "sleep_state",
            SLEEP_STATES,
        )
        sleep["awake"].set(1)  # the simulator never sleeps
        self.kv_usage = self._one(
            Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )

    def _build_counters(self) -> None:
        def counter(name: str, doc: str) -> Counter:
            return self._one(Counter, name, doc)

        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.external_queries = counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
        )
        self.external_hits = counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in "
            "terms of number of cached tokens.",
        )
        for what in ("queries", "hits"):
            counter(
                f"vllm:mm_cache_{what}",
                f"Multi-modal cache {what}, in terms of number of "
                f"{'queried' if what == 'queries' else 'cached'} items.",
            )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = self._by(
            Counter,
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            PROMPT_SOURCES,
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        self.cached_by_source = self._by(
            Counter,
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local "
            "HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM "
            "instance) or external_unspecified. Counted at admission; sums to "
            "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            "source",
            CACHE_HIT_SOURCES,
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.success = self._by(
            Counter,
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            FINISHED_REASONS,
        )
        # PerfMetricsProm: Model Flops Utilization estimates, which the simulator leaves at 0.
        for what, units in (
            ("flops", "floating point operations"),
            ("read_bytes", "bytes read from memory"),
            ("write_bytes", "bytes written to memory"),
        ):
            counter(
                f"vllm:estimated_{what}_per_gpu_total",
                f"Estimated number of {units} per GPU (for Model Flops Utilization calculations).",
            )

    def _build_histograms(self) -> None:
        hist, bounds = self._hist, self._buckets
        tokens = bounds["request_tokens"]
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            bounds["iteration_tokens"],
        )
        self.max_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_n = hist(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            bounds["request_params_n"],
        )
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            bounds["time_to_first_token"],
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            bounds["inter_token_latency"],
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            bounds["inter_token_latency"],
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            bounds["request_latency"],
        )
        self.phase = {
            phase: hist(
                f"vllm:request_{phase}_time_seconds",
                f"Histogram of time spent in {state} phase for request.",
                bounds["request_latency"],
            )
            for phase, state in (
                ("queue", "WAITING"),
                ("inference", "RUNNING"),
                ("prefill", "PREFILL"),
                ("decode", "DECODE"),
            )
        }
        self.request_preemptions = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            bounds["request_num_preemptions"],
        )
        self.prefill_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )

    def _build_nixl(self) -> None:
        """The NixlConnector's families (nixl/stats.py). Without a connector vLLM has none:
        they are then kept off the registry, so the engine can record unconditionally."""
        nixl = functools.partial(self._one, register=self.kv_role is not None)

        per = "NIXL KV Cache transfers."
        self.nixl_xfer_time = nixl(
            Histogram,
            "vllm:nixl_xfer_time_seconds",
            f"Histogram of transfer duration for {per}",
            buckets=NIXL_XFER_TIME_BUCKETS,
        )
        self.nixl_post_time = nixl(
            Histogram,
            "vllm:nixl_post_time_seconds",
            f"Histogram of transfer post time for {per}",
            buckets=NIXL_POST_TIME_BUCKETS,
        )
        self.nixl_bytes = nixl(
            Histogram,
            "vllm:nixl_bytes_transferred",
            f"Histogram of bytes transferred per {per}",
            buckets=NIXL_BYTES_BUCKETS,
        )
        self.nixl_descriptors = nixl(
            Histogram,
            "vllm:nixl_num_descriptors",
            "Histogram of number of descriptors per NIXL  KV Cache transfers.",
            buckets=NIXL_DESCRIPTORS_BUCKETS,
        )
        self.nixl_failed = nixl(
            Counter,
            "vllm:nixl_num_failed_transfers",
            "Number of failed NIXL KV Cache transfers, including handshake and notification "
            "failures. NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
        )
        nixl(
            Counter,
            "vllm:nixl_num_failed_notifications",
            "Number of failed NIXL KV Cache notifications. Retained for compatibility; these "
            "failures are also included in vllm:nixl_num_failed_transfers.",
        )
        self.nixl_expired = nixl(
            Counter,
            "vllm:nixl_num_kv_expired_reqs",
            "Number of requests that had their KV expire. NOTE: This metric is tracked on the "
            "P instance.",
        )
        self.nixl_after_expiry = nixl(
            Counter,
            "vllm:nixl_num_notifications_after_expiry",
            "Number of completion notifications for requests that were no longer tracked, "
            "usually because their KV lease expired. The KV blocks may have been reused "
            "before the transfer finished. Counted per notification (one per remote rank), "
            "not per request.",
        )

    # ----- recording -------------------------------------------------------------------------

    def bind_gauges(self, state: Callable[[], SchedulerState]) -> None:
        """Gauges read the engine's state at scrape time."""
        self.running.set_function(lambda: float(state().running))
        self.waiting.set_function(lambda: float(sum(state().waiting_by_reason.values())))
        self.kv_usage.set_function(lambda: state().kv_usage)
        for reason, gauge in self.waiting_by_reason.items():
            gauge.set_function(_count_of(state, lambda s: s.waiting_by_reason, reason))
        for stage, gauge in self.kv_fetch_by_stage.items():
            gauge.set_function(_count_of(state, lambda s: s.kv_fetch_by_stage, stage))

    def first_token(self, first: FirstToken) -> None:
        """Prompt accounting of vLLM's PromptTokenStats and the prefix-cache counters: every
        prompt token is computed here unless it came from a prefill engine (the simulator has
        no prefix cache, so local hits stay 0)."""
        external = first.external_tokens
        self.ttft.observe(first.ttft)
        self.prompt_tokens.inc(first.prompt_tokens)
        self.prompt_by_source["local_compute"].inc(first.prompt_tokens - external)
        self.prompt_by_source["external_kv_transfer"].inc(external)
        self.prompt_cached.inc(external)
        self.cached_by_source["p2p"].inc(external)
        self.prefix_queries.inc(first.prompt_tokens)
        if self.kv_role is not None:  # only a KV connector is asked for external hits
            self.external_queries.inc(first.prompt_tokens)
            self.external_hits.inc(external)
        self.params_n.observe(1)  # n > 1 is refused
        self.max_generation_tokens.observe(first.max_tokens)

    def request_finished(self, done: FinishedRequest) -> None:
        self.success[done.reason].inc()
        if done.reason == "abort":
            return
        self.e2e.observe(done.e2e)
        for phase, seconds in (
            ("queue", done.queued),
            ("prefill", done.prefill),
            ("inference", done.inference),
            ("decode", done.decode),
        ):
            self.phase[phase].observe(seconds)
        self.request_prompt_tokens.observe(done.prompt_tokens)
        self.request_generation_tokens.observe(done.generation_tokens)
        self.params_max_tokens.observe(done.max_tokens)
        self.request_preemptions.observe(done.preemptions)
        # No prefix cache: every prompt token counts as computed, also on a decode whose
        # KV came from a prefill (vLLM excludes only local cache hits here).
        self.prefill_kv_computed.observe(done.prompt_tokens)
        self.tpot.observe(done.mean_time_per_output_token)

    def kv_transfer(self, transfer: Transfer) -> None:
        self.nixl_post_time.observe(transfer.post_s)
        self.nixl_xfer_time.observe(transfer.xfer_s)
        self.nixl_bytes.observe(transfer.num_bytes)
        self.nixl_descriptors.observe(transfer.descriptors)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
