"""What a simulated engine's /metrics page shows, scraped into the benchmark's Prometheus.

Where it fits: `pdfleet_lab.sim.FleetSim` keeps one `EngineFamilies` per worker, records into
it where vLLM would (a request's first step and first token, each decode step, a finished
request), and at the scrape interval writes its families into `pdfleet_lab.tsdb.SimPrometheus`
with the labels the shipped scrape configuration gives a worker's series. The families, their
buckets and who counts what follow vLLM 0.33 in P/D mode as `pdfleet_worker.sim.metrics` does
(held to the real engine in tests/e2e/engine): the prefill engine counts the prompt, observes
each request's wait in its queue and its TTFT, and finishes each request after one token; the
decode engine counts the prompt again (as external KV), observes its own TTFT, every
inter-token latency and the request's time per output token. Decode steps are a fluid in the
simulator, so counts may be fractional.
"""

from __future__ import annotations

import bisect
import math

from pdfleet.autoscale import promql
from pdfleet_lab.tsdb import SimPrometheus
from pdfleet_worker.launcher import AGENT_ITL_BUCKETS, AGENT_REQUEST_LATENCY_BUCKETS
from pdfleet_worker.sim.metrics import TTFT_BUCKETS

NAMESPACE = "bench"
SERVICE = "fleet"


class Histogram:
    """A Prometheus histogram: per-bucket counts, their sum and count."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, weight: float = 1.0) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight

    def scrape(self, store: SimPrometheus, name: str, labels: dict[str, str], t: float) -> None:
        cumulative = 0.0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            cumulative += count
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            store.add(f"{name}_bucket", {**labels, "le": le}, t, cumulative)
        store.add(f"{name}_sum", labels, t, self.total)
        store.add(f"{name}_count", labels, t, cumulative)


class EngineFamilies:
    """The families of one engine that the operator's queries read."""

    def __init__(self, role: str, pod: str) -> None:
        self.labels = {
            promql.NAMESPACE_LABEL: NAMESPACE,
            promql.SERVICE_LABEL: SERVICE,
            promql.ROLE_LABEL: role,
            "pod": pod,
        }
        self.prompt_tokens = 0.0
        self.generation_tokens = 0.0
        self.requests = 0.0
        self.ttft = Histogram(TTFT_BUCKETS)
        # The inter-token latency family as the worker's agent sets it
        # (--custom-histogram-buckets): per-token ITL and the request's time per output token.
        self.itl = Histogram(AGENT_ITL_BUCKETS)
        self.tpot = Histogram(AGENT_ITL_BUCKETS)
        self.queue_time = Histogram(AGENT_REQUEST_LATENCY_BUCKETS)

    def scheduled(self, waited_s: float) -> None:
        """A request's first step, after `waited_s` in the queue."""
        self.queue_time.observe(waited_s)

    def first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        self.ttft.observe(ttft_s)
        self.prompt_tokens += prompt_tokens

    def decoded(self, tokens: float, step_s: float) -> None:
        """`tokens` generated in steps of `step_s` each (every token but a request's first
        is one inter-token latency)."""
        self.generation_tokens += tokens
        self.itl.observe(step_s, tokens)

    def finished(self, time_per_output_token_s: float | None) -> None:
        self.requests += 1
        if time_per_output_token_s is not None:
            self.tpot.observe(time_per_output_token_s)

    def scrape(self, store: SimPrometheus, t: float, waiting: float, kv_usage: float) -> None:
        labels = self.labels
        store.add(promql.PROMPT_TOKENS, labels, t, self.prompt_tokens)
        store.add(promql.GENERATION_TOKENS, labels, t, self.generation_tokens)
        store.add(promql.REQUESTS, labels, t, self.requests)
        store.add(promql.WAITING, labels, t, waiting)
        store.add(promql.KV_USAGE, labels, t, kv_usage)
        self.ttft.scrape(store, promql.TTFT, labels, t)
        self.itl.scrape(store, promql.ITL, labels, t)
        self.tpot.scrape(store, promql.TPOT, labels, t)
        self.queue_time.scrape(store, promql.QUEUE_TIME, labels, t)
