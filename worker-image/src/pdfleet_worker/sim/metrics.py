"""vLLM 0.33's Prometheus metrics, with its names, labels and bucket boundaries.

Where it fits: the simulator's /metrics. The autoscaler's PromQL, the drain logic and the
router's engine discovery (it counts `engine=` labels) read these exactly as they would from
vLLM's v1 PrometheusStatLogger. Counters get `_total` on the wire, as prometheus_client does
for vLLM. Times are simulated seconds (wall seconds / --time-scale).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# nixl/stats.py: 2^(10+i) for i = 1, 3, ..., 23
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 24, 2))
NIXL_TIME_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    5.0,
)
FINISHED_REASONS = ("stop", "length", "abort", "error")


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


class EngineMetrics:
    """The metric families of one engine (`engine` label = DP rank, "0" for DP=1)."""

    def __init__(self, model_name: str, engine: str = "0", max_model_len: int = 131072) -> None:
        # vLLM's /metrics carries no `_created` series; the switch is process-wide.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        r = self.registry
        labels = ["model_name", "engine"]
        lv = {"model_name": model_name, "engine": engine}
        self._lv = lv
        tok = request_token_buckets(max_model_len)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.running = Gauge(
            "vllm:num_requests_running", "Running requests.", labels, registry=r
        ).labels(**lv)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Waiting requests.", labels, registry=r
        ).labels(**lv)
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", labels, registry=r
        ).labels(**lv)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r
        ).labels(**lv)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens.", labels, registry=r
        ).labels(**lv)
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative preemptions.", labels, registry=r
        ).labels(**lv)
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries", "Prefix cache queries.", labels, registry=r
        ).labels(**lv)
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits.", labels, registry=r
        ).labels(**lv)
        self._success = Counter(
            "vllm:request_success", "Finished requests.", [*labels, "finished_reason"], registry=r
        )
        for reason in FINISHED_REASONS:  # vLLM pre-creates every reason's series
            self._success.labels(**lv, finished_reason=reason)
        self.ttft = hist("vllm:time_to_first_token_seconds", "TTFT.", TTFT_BUCKETS).labels(**lv)
        self.itl = hist("vllm:inter_token_latency_seconds", "ITL.", ITL_BUCKETS).labels(**lv)
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds", "TPOT per request.", ITL_BUCKETS
        ).labels(**lv)
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "E2E latency.", REQUEST_LATENCY_BUCKETS
        ).labels(**lv)
        self.queue_time = hist(
            "vllm:request_queue_time_seconds", "Time in WAITING.", REQUEST_LATENCY_BUCKETS
        ).labels(**lv)
        self.inference_time = hist(
            "vllm:request_inference_time_seconds", "Time RUNNING.", REQUEST_LATENCY_BUCKETS
        ).labels(**lv)
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds", "Prefill phase.", REQUEST_LATENCY_BUCKETS
        ).labels(**lv)
        self.decode_time = hist(
            "vllm:request_decode_time_seconds", "Decode phase.", REQUEST_LATENCY_BUCKETS
        ).labels(**lv)
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Prompt tokens.", tok
        ).labels(**lv)
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Generation tokens.", tok
        ).labels(**lv)
        self.request_max_tokens = hist("vllm:request_params_max_tokens", "max_tokens.", tok).labels(
            **lv
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Tokens per step.", ITERATION_TOKEN_BUCKETS
        ).labels(**lv)
        # NixlConnector (nixl/stats.py)
        self.nixl_xfer_time = hist(
            "vllm:nixl_xfer_time_seconds", "KV transfer time.", NIXL_TIME_BUCKETS
        ).labels(**lv)
        self.nixl_bytes = hist(
            "vllm:nixl_bytes_transferred", "KV bytes per transfer.", NIXL_BYTES_BUCKETS
        ).labels(**lv)
        self.nixl_failed = Counter(
            "vllm:nixl_num_failed_transfers", "Failed KV transfers.", labels, registry=r
        ).labels(**lv)
        self.nixl_expired = Counter(
            "vllm:nixl_num_kv_expired_reqs",
            "Prefill KV freed unread after the lease.",
            labels,
            registry=r,
        ).labels(**lv)

    def request_success(self, reason: str) -> None:
        self._success.labels(**self._lv, finished_reason=reason).inc()

    def bind_gauges(
        self,
        running: Callable[[], float],
        waiting: Callable[[], float],
        kv_usage: Callable[[], float],
    ) -> None:
        """Gauges read the engine's state at scrape time."""
        self.running.set_function(running)
        self.waiting.set_function(waiting)
        self.kv_usage.set_function(kv_usage)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
