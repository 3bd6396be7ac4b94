"""The drain's only network I/O: the routers' admin API and gauges, the workers' own metrics.

Where it fits: the controller builds a `RouterFleet` from the service's router pods (their pod
IPs; admin API on the serving port, gauges on the metrics port) only while a drain is active,
reads `WorkerLoad`s for the pods the planner (drain/plan.py) is about, and the executor
(drain/executor.py) calls `deregister()`. Parsing is pure and kept apart from the calls.

What vllm-router 0.1.17 offers (docs/drain.md): `DELETE /workers/<percent-encoded URL>` answers
200 even for a URL it does not know, so a removal is confirmed with `GET /workers`; each
replica counts only its own traffic, so gauges are summed over every replica; a removed
worker's gauges keep tracking the requests it still serves.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Container, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pdfleet import httpclient, labels
from pdfleet.drain.plan import WorkerLoad

log = logging.getLogger(__name__)

# The router's per-worker in-flight gauges (reference/router-behaviour.md §5).
DECODE_GAUGES = ("vllm_router_pd_pending_decode_requests", "vllm_router_pd_active_decode_requests")
PREFILL_GAUGE = "vllm_router_pd_prefill_occupancy"
# The waiting gauge includes a decode's requests deferred while their KV is pulled (vLLM's
# logger sets it to capacity + deferred), so the by-reason split is not added again.
ENGINE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
KV_USAGE = "vllm:kv_cache_usage_perc"
# Requests of one drain reading in flight at once (routers and workers).
READ_CONCURRENCY = 8


def _samples(text: str, names: Container[str]) -> Iterable[tuple[str, Mapping[str, str], float]]:
    """The samples of `names` on a Prometheus page. ValueError when the page is not one, or
    when one of those samples is NaN, infinite or negative: in-flight gauges are never that,
    and a reading that says so cannot be trusted to say "idle" either (its reader treats it
    as unanswered). Other series on the page are not the drain's business."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in names:
                continue
            value = float(sample.value)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{sample.name}: {sample.value!r} is not a gauge reading")
            yield sample.name, sample.labels, value


def parse_workers(payload: object) -> set[str]:
    """The worker URLs of a `GET /workers` answer; ValueError for any other shape."""
    workers = payload.get("workers") if isinstance(payload, dict) else None
    if not isinstance(workers, list) or not all(
        isinstance(w, dict) and isinstance(w.get("url"), str) for w in workers
    ):
        raise ValueError(f"not a worker list: {str(payload)[:200]!r}")
    return {w["url"] for w in workers}


def parse_held(payload: object) -> float:
    """pdfleet-sim's count of prefills still holding KV for a decode; ValueError otherwise."""
    held = payload.get("held_now") if isinstance(payload, dict) else None
    if isinstance(held, bool) or not isinstance(held, int | float):
        raise ValueError(f"not a held count: {str(payload)[:200]!r}")
    if not math.isfinite(held) or held < 0:
        raise ValueError(f"not a held count: {held!r}")
    return float(held)


def parse_router_gauges(text: str) -> dict[str, dict[str, float]]:
    """{role: {worker URL: in-flight}} from one router replica's Prometheus page.

    Decode: pending (decode chosen, request still in prefill) + active, over all ranks.
    Prefill: occupancy; the `aggregate` rank when present, else the sum of ranks."""
    decode: dict[str, float] = {}
    prefill_rank: dict[str, float] = {}
    prefill_aggregate: dict[str, float] = {}
    for name, sample_labels, value in _samples(text, (*DECODE_GAUGES, PREFILL_GAUGE)):
        worker = sample_labels.get("worker")
        if worker is None:
            continue
        if name in DECODE_GAUGES:
            decode[worker] = decode.get(worker, 0.0) + value
        elif name == PREFILL_GAUGE:
            if sample_labels.get("rank") == "aggregate":
                prefill_aggregate[worker] = value
            else:
                prefill_rank[worker] = prefill_rank.get(worker, 0.0) + value
    return {
        labels.ROLE_DECODE: decode,
        labels.ROLE_PREFILL: {**prefill_rank, **prefill_aggregate},
    }


def parse_engine(text: str) -> tuple[float, float]:
    """(running + waiting over every engine, highest KV cache usage) from a vLLM /metrics."""
    in_flight, kv_usage = 0.0, 0.0
    for name, _, value in _samples(text, (*ENGINE_GAUGES, KV_USAGE)):
        if name in ENGINE_GAUGES:
            in_flight += value
        elif name == KV_USAGE:
            kv_usage = max(kv_usage, value)
    return in_flight, kv_usage


def sum_gauges(pages: Sequence[Mapping[str, Mapping[str, float]]], role: str, url: str) -> float:
    return sum(page.get(role, {}).get(url, 0.0) for page in pages)


@dataclass(frozen=True)
class RouterReplica:
    admin_url: str
    metrics_url: str


def router_replicas(pod_ips: Iterable[str], port: int, metrics_port: int) -> list[RouterReplica]:
    return [
        RouterReplica(f"http://{ip}:{port}", f"http://{ip}:{metrics_port}")
        for ip in sorted(pod_ips)
    ]


class RouterError(Exception):
    """A router replica could not be read or did not confirm a removal."""


class SilentHostError(httpx.TransportError):
    """A host that recently let a request time out: not asked again yet."""


def request(client: httpx.Client, method: str, url: str) -> httpx.Response:
    """One request, refused at once for a host that let one time out lately (it is then
    unknown to the drain, as a timeout is, without waiting the timeout out again)."""
    if httpclient.SILENT.silent(url):
        raise SilentHostError(f"{url}: timed out lately; not asked again yet")
    try:
        return client.request(method, url)
    except httpx.TimeoutException:
        httpclient.SILENT.timed_out(url)
        raise


class RouterFleet:
    """Every replica of one service's router, through one HTTP client."""

    def __init__(self, replicas: Sequence[RouterReplica], client: httpx.Client | None = None):
        self.replicas = list(replicas)
        self._owns_client = client is None
        self.client = client or httpx.Client(timeout=httpclient.TIMEOUT)

    def close(self) -> None:
        """Close the client if this fleet made it (a shared one outlives the pass)."""
        if self._owns_client:
            self.client.close()

    def workers(self, replica: RouterReplica) -> set[str]:
        try:
            resp = request(self.client, "GET", f"{replica.admin_url}/workers")
            resp.raise_for_status()
            return parse_workers(resp.json())
        except (httpx.HTTPError, ValueError) as error:
            raise RouterError(f"{replica.admin_url}/workers: {error!r}") from error

    def registered(self) -> tuple[set[str], bool]:
        """Union of every replica's workers, and whether every replica answered."""
        union: set[str] = set()
        complete = True
        for replica in self.replicas:
            try:
                union |= self.workers(replica)
            except RouterError as error:
                log.warning("%s", error)
                complete = False
        return union, complete

    def deregister(self, url: str) -> None:
        """Remove `url` from every replica and confirm each removal with GET /workers.

        The path carries the exact URL string, percent-encoded (a trailing slash or a
        different spelling names another, unknown worker, which also answers 200)."""
        path = quote(url, safe="")
        failures: list[str] = []
        for replica in self.replicas:
            try:
                if url in self.workers(replica):
                    url_path = f"{replica.admin_url}/workers/{path}"
                    request(self.client, "DELETE", url_path).raise_for_status()
                if url in self.workers(replica):
                    failures.append(f"{replica.admin_url}: still lists {url}")
            except (httpx.HTTPError, RouterError) as error:
                failures.append(f"{replica.admin_url}: {error!r}")
        if failures:
            raise RouterError("; ".join(failures))

    def gauges(self) -> tuple[list[dict[str, dict[str, float]]], bool]:
        """Each replica's per-worker gauges, and whether every replica answered."""
        pages: list[dict[str, dict[str, float]]] = []
        complete = True
        for replica in self.replicas:
            try:
                resp = request(self.client, "GET", f"{replica.metrics_url}/metrics")
                resp.raise_for_status()
                pages.append(parse_router_gauges(resp.text))
            except (httpx.HTTPError, ValueError) as error:
                log.warning("%s/metrics: %r", replica.metrics_url, error)
                complete = False
        return pages, complete


def read_engine(client: httpx.Client, url: str, role: str) -> tuple[float | None, float | None]:
    """(in-flight, KV blocks awaiting a pull) of one worker; an engine that refuses the
    connection holds nothing any more (0, 0), a slow or broken one is unknown (None)."""
    try:
        resp = request(client, "GET", f"{url}/metrics")
        resp.raise_for_status()
        in_flight, kv_usage = parse_engine(resp.text)
    except httpx.ConnectError:
        return 0.0, 0.0
    except (httpx.HTTPError, ValueError) as error:
        log.warning("%s/metrics: %r", url, error)
        return None, None
    if role != labels.ROLE_PREFILL:
        return in_flight, 0.0
    # pdfleet-sim says exactly how many finished prefills still hold KV for a decode. vLLM
    # has no such gauge: on an idle prefill, blocks still in use are blocks held for a pull.
    try:
        stats = request(client, "GET", f"{url}/sim/stats")
        if stats.status_code == 200:
            return in_flight, parse_held(stats.json())
    except (httpx.HTTPError, ValueError):
        pass
    return in_flight, kv_usage


def read_loads(fleet: RouterFleet, workers: Mapping[str, tuple[str, str]]) -> dict[str, WorkerLoad]:
    """A WorkerLoad for each pod name -> (worker URL, role).

    The routers and every worker are read at once: one at a time, the reads of several
    draining workers add up on a loaded node, and every second of them is added to every
    drain."""
    if not workers:
        return {}
    with ThreadPoolExecutor(max_workers=READ_CONCURRENCY) as pool:
        listing = pool.submit(fleet.registered)
        gauges = pool.submit(fleet.gauges)
        engines = {
            name: pool.submit(read_engine, fleet.client, url, role)
            for name, (url, role) in workers.items()
        }
        listed, listed_complete = listing.result()
        pages, gauges_complete = gauges.result()
    loads: dict[str, WorkerLoad] = {}
    for name, (url, role) in workers.items():
        engine, kv = engines[name].result()
        registered: bool | None = url in listed or (None if not listed_complete else False)
        loads[name] = WorkerLoad(
            registered=registered,
            router_in_flight=sum_gauges(pages, role, url) if gauges_complete else None,
            engine_in_flight=engine,
            kv_pending=kv,
        )
    return loads
