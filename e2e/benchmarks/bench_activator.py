"""What the activator costs while a service is awake, and its hold path against the real router.

Where it fits: docs/design/scale-to-zero.md puts `pdfleet activator` (pdfleet.activator) in the
data path of every service that may scale to zero, in front of its vllm-router. This measures it
on loopback, without a cluster: the real vllm-router 0.1.17 in P/D mode (`.venv/bin/vllm-router`),
one prefill and one decode `pdfleet-sim` behind it (pdfleet_worker.sim.procs starts them, as in
tests/integration/router), and the activator as the process the operator deploys. One run:

1. **Awake.** The same streamed completions straight to the router and through the activator,
   in alternating blocks (ABBA...), at each `--concurrency` (closed loop, each client pausing
   a random 0 to `--think-ms` before each request): time to the response headers (first
   byte), to the first token and to `[DONE]`, medians and p95, and what the activator adds
   (difference and ratio). Its RSS (`/proc/<pid>/status`) idle and after the
   load, and its CPU a request next to the router's.
2. **At zero.** Both sims stop; the router's health checker marks them unhealthy and its
   `/readiness` says 503, as for a service with no pods. A request straight to the router gets
   its 503 at once; one through an activator with `--max-wait` gets the activator's 503 with
   `Retry-After` once maxWait has passed.
3. **Hold and wake.** A fresh activator in front of the router at zero; `--held` streamed
   requests, sent 25 ms apart, are held; then a prefill and a decode sim start on the ports the
   router knows, it finds its pair, and the activator lets the requests go. A TCP relay between
   the activator and the router notes the order they reached the router (each carries an
   `X-Bench-Seq` header); every request's status, wait and first byte are kept.

    make bench-activator
    .venv/bin/python -m e2e.benchmarks.bench_activator --requests 40 --out /tmp/activator

Prints the tables and writes `results.json` (every figure) and `results.md` (the tables) to
`--out` (default docs/benchmarks/activator); exits 1 when a check fails (a request lost or out
of order, or an answer other than the documented one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp

from e2e.platform.cluster import REPO_ROOT
from e2e.platform.loadgen import parse_stream_line, prompt_of
from e2e.platform.operator_process import parse_metrics
from e2e.platform.stats import percentile
from pdfleet_worker.sim.procs import (
    Proc,
    SimProc,
    free_port,
    start_sim,
    static_router_argv,
    stopping,
    wait_http,
)

OUT_DIR = REPO_ROOT / "docs" / "benchmarks" / "activator"
BIN = Path(sys.executable).parent
MODEL = "sim-model"
SERVICE = "bench/activator"
# The H200 preset's latencies; stopping a sim aborts whatever it holds.
SIM_ARGS = ("--preset", "llama-3.1-8b-h200", "--shutdown-timeout", "0")
# As the operator renders the router (render/router.py), with static workers, not discovery.
ROUTER_ARGS = (
    "--policy", "round_robin", "--health-check-interval-secs", "1",
    "--health-failure-threshold", "2", "--worker-startup-check-interval", "1",
    "--worker-startup-timeout-secs", "30", "--log-level", "info",
)  # fmt: skip
HOLD_MAX_WAIT_S = 120.0  # maxWait of the activators that must not expire anything
RETRY_AFTER_S = 5.0
STAGGER_S = 0.025  # between the held requests: their arrival order is defined
SEQ_HEADER = "X-Bench-Seq"
_SEQ = re.compile(rb"\r\nx-bench-seq:[ \t]*(\d+)(?=\r\n)", re.IGNORECASE)
METRIC = "pdfleet_activator_"
ARMS = ("direct", "activator")
TIMES = {"ttfb": "first byte", "ttft": "first token", "total": "whole stream"}
POLL_S = 0.05


def _log(message: str) -> None:
    print(f"[bench-activator {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----- processes ------------------------------------------------------------------------------


def start_pair(log_dir: Path, time_scale: float) -> tuple[SimProc, SimProc]:
    """A prefill and a decode sim on free ports."""
    extra = [*SIM_ARGS, "--time-scale", f"{time_scale:g}"]
    prefill = start_sim(str(log_dir), MODEL, extra, timeout_s=60.0, name="prefill")
    try:
        decode = start_sim(str(log_dir), MODEL, extra, timeout_s=60.0, name="decode")
    except BaseException:
        prefill.stop()
        raise
    return prefill, decode


def restart_sim(old: SimProc, log_dir: Path, name: str) -> SimProc:
    """A new sim with a stopped one's command line, so on its ports: the router's static pair
    comes back as a woken pool's pods would."""
    log = str(log_dir / f"{name}.log")
    sim = SimProc(old.argv, log, port=old.port, side_channel_port=old.side_channel_port)
    sim.start()
    try:
        wait_http(f"{sim.url}/health", 60.0, sim.popen)
    except BaseException:
        sim.stop()
        raise
    return sim


def start_router(log_dir: Path, prefill: SimProc, decode: SimProc) -> tuple[Proc, str]:
    port, prom = free_port(), free_port()
    argv = static_router_argv(port, prom, [prefill.url], [decode.url], ROUTER_ARGS)
    url = f"http://127.0.0.1:{port}"
    return _started(Proc(argv, str(log_dir / "router.log")), url, "/readiness")


def start_activator(log_dir: Path, upstream: str, name: str, max_wait_s: float) -> tuple[Proc, str]:
    """`pdfleet activator` as the operator runs it, on a free loopback port."""
    port = free_port()
    argv = [
        str(BIN / "pdfleet"), "activator", "--upstream", upstream, "--service", SERVICE,
        "--listen", f"127.0.0.1:{port}", "--max-wait", f"{max_wait_s:g}",
        "--retry-after", f"{RETRY_AFTER_S:g}",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    return _started(Proc(argv, str(log_dir / f"{name}.log")), url, "/healthz")


def _started(proc: Proc, url: str, ready_path: str) -> tuple[Proc, str]:
    proc.start()
    try:
        wait_http(url + ready_path, 60.0, proc.popen)
    except BaseException:
        print(proc.log()[-3000:], file=sys.stderr)
        proc.stop()
        raise
    return proc, url


@dataclass(frozen=True)
class Usage:
    rss_mb: float
    hwm_mb: float
    """VmHWM: the highest RSS so far."""
    cpu_s: float


def usage(pid: int) -> Usage:
    """RSS, peak RSS and CPU seconds (user + system) of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    lines = (line.partition(":") for line in status.splitlines())
    kb = {key: int(value.split()[0]) for key, _, value in lines if key in ("VmRSS", "VmHWM")}
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return Usage(kb["VmRSS"] / 1024, kb["VmHWM"] / 1024, cpu)


# ----- the client -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One streamed completion as the client saw it: `sent_s` is monotonic, the other times
    seconds after it (NaN: never came)."""

    status: int
    sent_s: float
    ttfb_s: float
    ttft_s: float
    total_s: float
    tokens: int = 0
    done: bool = False
    retry_after: str | None = None
    body: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and self.tokens > 0


def completion(prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": prompt_of(prompt_tokens),
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }


async def stream(
    session: aiohttp.ClientSession,
    base: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> Sample:
    """POST /v1/completions and read the stream to its end."""
    sent = time.monotonic()
    ttfb = ttft = math.nan
    tokens, done = 0, False
    try:
        async with session.post(f"{base}/v1/completions", json=body, headers=headers) as resp:
            ttfb = time.monotonic() - sent
            if resp.status != 200:
                text = " ".join((await resp.text()).split())[:1000]
                retry, total = resp.headers.get("Retry-After"), time.monotonic() - sent
                return Sample(resp.status, sent, ttfb, ttft, total, retry_after=retry, body=text)
            async for raw in resp.content:
                finished, count = parse_stream_line(raw.decode().strip())
                if count and not tokens:
                    ttft = time.monotonic() - sent
                tokens += count
                done = done or finished
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        elapsed = time.monotonic() - sent
        return Sample(0, sent, ttfb, ttft, elapsed, tokens, body=repr(error))
    return Sample(200, sent, ttfb, ttft, time.monotonic() - sent, tokens, done)


async def closed_loop(
    session: aiohttp.ClientSession,
    base: str,
    body: Mapping[str, Any],
    n: int,
    clients: int,
    think_s: float,
    seed: int = 0,
) -> tuple[list[Sample], float]:
    """`n` requests from `clients` clients, each sending its next one a random pause (0 to
    `think_s`) after its last one ended; (samples, wall seconds). Without the pause, clients
    that a batching engine served in one step come back together and stay in step: the
    median then depends on how they happen to have locked, not on the path."""
    samples: list[Sample] = []
    left = [n]
    pauses = random.Random(seed)

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            await asyncio.sleep(pauses.uniform(0, think_s))
            samples.append(await stream(session, base, body))

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return samples, time.monotonic() - started


# ----- figures (pure) -------------------------------------------------------------------------


def spread_ms(seconds: Sequence[float]) -> dict[str, float]:
    """Median and p95 (nearest rank) in milliseconds; NaNs left out."""
    ms = [s * 1000 for s in seconds if not math.isnan(s)]
    return {"median": statistics.median(ms) if ms else math.nan, "p95": percentile(ms, 95)}


def arm_summary(samples: Sequence[Sample], wall_s: float) -> dict[str, Any]:
    """One side of a comparison: how many answered in full, and their times."""
    ok = [s for s in samples if s.ok]
    tokens = [s.tokens for s in ok]
    return {
        "requests": len(samples),
        "ok": len(ok),
        "failed": [f"{s.status} {s.body[:120]}" for s in samples if not s.ok][:5],
        "requests_per_s": len(samples) / wall_s if wall_s else math.nan,
        "tokens": [min(tokens), max(tokens)] if tokens else [],
        **{f"{t}_ms": spread_ms([getattr(s, f"{t}_s") for s in ok]) for t in TIMES},
    }


def added(direct: Mapping[str, Any], via: Mapping[str, Any]) -> dict[str, Any]:
    """What the activator adds to each time: the difference (ms) and the ratio, of the medians
    and of the p95s."""
    out: dict[str, Any] = {}
    for t in TIMES:
        d, v = direct[f"{t}_ms"], via[f"{t}_ms"]
        out[t] = {}
        for q in ("median", "p95"):
            out[t][f"{q}_ms"] = v[q] - d[q]
            out[t][f"{q}_ratio"] = v[q] / d[q] if d[q] else math.nan
    return out


def inversions(order: Sequence[int]) -> int:
    """Pairs that came out in the other order than they went in (0: the same order)."""
    return sum(1 for i, a in enumerate(order) for b in order[i + 1 :] if a > b)


def header_seqs(data: bytes) -> list[int]:
    """The X-Bench-Seq values in `data`, bytes on their way to the router."""
    return [int(m.group(1)) for m in _SEQ.finditer(data)]


def held_rows(
    samples: Sequence[Sample], reached: Mapping[int, float], origin: float
) -> list[dict[str, Any]]:
    """A row for each held request (seq = index): when it was sent and reached the router,
    seconds after `origin`; how long it was held; its answer."""
    rows = []
    for seq, s in enumerate(samples):
        at = reached.get(seq, math.nan)
        rows.append(
            {
                "seq": seq,
                "status": s.status,
                "tokens": s.tokens,
                "done": s.done,
                "sent_s": s.sent_s - origin,
                "reached_router_s": at - origin,
                "held_s": at - s.sent_s,
                "first_byte_s": s.sent_s + s.ttfb_s - origin,
                "ended_s": s.sent_s + s.total_s - origin,
            }
        )
    return rows


# ----- the relay that sees the order ----------------------------------------------------------


class Tap:
    """A TCP relay in front of the router: notes when each request's X-Bench-Seq header passes
    from the activator to the router, and passes every byte on unchanged."""

    TAIL = 64  # bytes kept from the last read: a header split across two reads is still seen

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.reached: dict[int, float] = {}
        """Seq -> monotonic time it passed, in the order they passed."""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._relays: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._relays, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (task := asyncio.current_task()) is not None:
            self._relays.add(task)
            task.add_done_callback(self._relays.discard)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, note=True),
                self._pipe(up_reader, writer, note=False),
                return_exceptions=True,
            )
        finally:
            for w in (writer, up_writer):
                w.close()
                self._writers.discard(w)

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, note: bool
    ) -> None:
        tail = b""
        try:
            while data := await src.read(65536):
                if note:
                    now = time.monotonic()
                    for seq in header_seqs(tail + data):
                        self.reached.setdefault(seq, now)
                    tail = data[-self.TAIL :]
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()  # one way ended: the other way's read ends too


# ----- polling --------------------------------------------------------------------------------


async def wait_status(
    session: aiohttp.ClientSession,
    url: str,
    status: int,
    timeout_s: float,
    until: Callable[[str], bool] = lambda _: True,
) -> tuple[float, str]:
    """Poll GET `url` until it answers `status` with a body `until` accepts (a refused
    connection answers nothing); (monotonic time, body)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                text = " ".join((await resp.text()).split())
                if resp.status == status and until(text):
                    return time.monotonic(), text
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"{url} did not answer {status} within {timeout_s}s")


def no_healthy_worker(readiness: str) -> bool:
    """The router's /readiness body counts no healthy prefill and no healthy decode."""
    with contextlib.suppress(ValueError):
        body = json.loads(readiness)
        return all(body.get(role, {}).get("healthy") == 0 for role in ("prefill", "decode"))
    return False


async def activator_metrics(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """The activator's own series, the prefix left out."""
    async with session.get(f"{base}/metrics") as resp:
        samples = parse_metrics(await resp.text())
    return {k.removeprefix(METRIC): v for k, v in samples.items() if k.startswith(METRIC)}


async def wait_held(
    session: aiohttp.ClientSession, base: str, n: int, timeout_s: float
) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while (metrics := await activator_metrics(session, base))["requests_held"] < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the activator holds {metrics['requests_held']:g} of {n}")
        await asyncio.sleep(POLL_S)
    return metrics


# ----- 1. awake -------------------------------------------------------------------------------


async def compare(
    session: aiohttp.ClientSession,
    bases: Mapping[str, str],
    args: argparse.Namespace,
    clients: int,
) -> dict[str, Any]:
    """The same completions straight to the router and through the activator, `clients` at a
    time, in blocks ABBA...: a slow spell of the machine falls on both sides."""
    body = completion(args.prompt_tokens, args.max_tokens)
    think_s = args.think_ms / 1000
    for arm in ARMS:  # connections open, both sides warm
        await closed_loop(session, bases[arm], body, args.warmup, clients, think_s)
    samples: dict[str, list[Sample]] = {arm: [] for arm in ARMS}
    wall = dict.fromkeys(ARMS, 0.0)
    per_block = max(1, args.requests // args.blocks)
    for block in range(args.blocks):
        for arm in ARMS if block % 2 == 0 else ARMS[::-1]:
            got, seconds = await closed_loop(
                session, bases[arm], body, per_block, clients, think_s, seed=block
            )
            samples[arm] += got
            wall[arm] += seconds
    arms = {arm: arm_summary(samples[arm], wall[arm]) for arm in ARMS}
    return {"concurrency": clients, **arms, "added": added(arms["direct"], arms["activator"])}


def cost(before: Usage, after: Usage, requests: int) -> dict[str, Any]:
    return {
        "idle": asdict(before),
        "after_load": asdict(after),
        "requests": requests,
        "cpu_ms_per_request": (after.cpu_s - before.cpu_s) / requests * 1e3,
    }


async def measure_awake(
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    router: tuple[Proc, str],
    log_dir: Path,
    procs: list[Proc],
) -> dict[str, Any]:
    _log("awake: an activator in front of the router and its pair")
    proc, url = await asyncio.to_thread(
        start_activator, log_dir, router[1], "activator-awake", HOLD_MAX_WAIT_S
    )
    procs.append(proc)
    await asyncio.sleep(args.settle_s)
    before = usage(proc.popen.pid), usage(router[0].popen.pid)
    levels = []
    for clients in args.concurrency:
        _log(f"awake: {args.requests} requests a side, {clients} at a time")
        bases = {"direct": router[1], "activator": url}
        levels.append(await compare(session, bases, args, clients))
    after = usage(proc.popen.pid), usage(router[0].popen.pid)
    via = sum(level["activator"]["requests"] + args.warmup for level in levels)
    await asyncio.to_thread(proc.stop)
    return {
        "latency": levels,
        "activator": cost(before[0], after[0], via),
        "router": cost(before[1], after[1], 2 * via),  # both sides went through it
    }


# ----- 2. at zero -----------------------------------------------------------------------------


async def to_zero(
    session: aiohttp.ClientSession, router: str, sims: Sequence[SimProc]
) -> dict[str, Any]:
    """Stop the pair; the router's /readiness turns 503, then counts neither healthy; a
    request straight to the router."""
    stopped = time.monotonic()
    for sim in sims:
        await asyncio.to_thread(sim.stop)
    readiness = f"{router}/readiness"
    first, _ = await wait_status(session, readiness, 503, 30.0)
    at, reason = await wait_status(session, readiness, 503, 30.0, no_healthy_worker)
    direct = await stream(session, router, completion(16, 4))
    _log(f"at zero: /readiness 503 {first - stopped:.1f} s after the sims stopped; straight "
         f"to the router: {direct.status} in {direct.total_s * 1e3:.1f} ms")  # fmt: skip
    return {
        "readiness_503_after_s": first - stopped,
        "no_healthy_worker_after_s": at - stopped,
        "readiness_body": reason[:300],
        "direct": {"status": direct.status, "ms": direct.total_s * 1e3, "body": direct.body},
    }


def error_of(body: str) -> dict[str, Any]:
    """The OpenAI-shaped error object of an answer's body ({} if none)."""
    with contextlib.suppress(ValueError):
        parsed = json.loads(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            return dict(parsed["error"])
    return {}


async def measure_expiry(
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    router: str,
    log_dir: Path,
    procs: list[Proc],
) -> dict[str, Any]:
    """One request through an activator with a short maxWait while the router has no pair."""
    proc, url = await asyncio.to_thread(
        start_activator, log_dir, router, "activator-expiry", args.max_wait
    )
    procs.append(proc)
    sample = await stream(session, url, completion(16, 4))
    metrics = await activator_metrics(session, url)
    await asyncio.to_thread(proc.stop)
    error = error_of(sample.body)
    _log(f"maxWait {args.max_wait:g} s: {sample.status} after {sample.total_s:.2f} s, "
         f"Retry-After {sample.retry_after}")  # fmt: skip
    return {
        "max_wait_s": args.max_wait,
        "status": sample.status,
        "after_s": sample.total_s,
        "retry_after": sample.retry_after,
        "expected_retry_after": f"{RETRY_AFTER_S:g}",
        "error_type": error.get("type"),
        "message": error.get("message"),
        "expired_total": metrics.get("expired_total"),
    }


# ----- 3. hold and wake -----------------------------------------------------------------------


async def send_held(
    session: aiohttp.ClientSession, url: str, args: argparse.Namespace
) -> list[asyncio.Task[Sample]]:
    """`--held` streams, STAGGER_S apart, each with its place in X-Bench-Seq."""
    body = completion(args.prompt_tokens, args.max_tokens)
    tasks = []
    for seq in range(args.held):
        request = stream(session, url, body, {SEQ_HEADER: str(seq)})
        tasks.append(asyncio.create_task(request))
        await asyncio.sleep(STAGGER_S)
    return tasks


async def wake_pair(
    session: aiohttp.ClientSession,
    router: str,
    sims: Sequence[SimProc],
    log_dir: Path,
    procs: list[Proc],
) -> tuple[dict[str, float], list[SimProc]]:
    """Start the pair again on the router's ports; when they started, answered, and when the
    router said ready."""
    started = time.monotonic()
    ready = asyncio.create_task(wait_status(session, f"{router}/readiness", 200, 60.0))
    got = await asyncio.gather(
        *(
            asyncio.to_thread(restart_sim, sim, log_dir, f"{Path(sim.log_path).stem}-woken")
            for sim in sims
        ),
        return_exceptions=True,
    )
    woken = [sim for sim in got if isinstance(sim, SimProc)]
    procs.extend(woken)
    for failure in got:
        if isinstance(failure, BaseException):
            ready.cancel()
            raise failure
    sims_up = time.monotonic()
    ready_at, _ = await ready
    return {"started": started, "sims_up": sims_up, "router_ready": ready_at}, woken


async def hold_and_wake(
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    router: str,
    sims: Sequence[SimProc],
    log_dir: Path,
    procs: list[Proc],
) -> dict[str, Any]:
    """`--held` requests to an activator in front of the router at zero, then the pair back."""
    tap = Tap(int(router.rsplit(":", 1)[1]))
    proc, url = await asyncio.to_thread(
        start_activator, log_dir, await tap.start(), "activator-hold", HOLD_MAX_WAIT_S
    )
    procs.append(proc)
    try:
        before = await activator_metrics(session, url)
        memory = {"idle": asdict(usage(proc.popen.pid))}
        tasks = await send_held(session, url, args)
        held = await wait_held(session, url, args.held, 30.0)
        memory["holding"] = asdict(usage(proc.popen.pid))
        await asyncio.sleep(args.hold_s)
        _log(f"hold: {held['requests_held']:g} held; starting a prefill and a decode sim")
        wake, woken = await wake_pair(session, router, sims, log_dir, procs)
        samples = await asyncio.gather(*tasks)
        after = await activator_metrics(session, url)
        memory["after"] = asdict(usage(proc.popen.pid))
        stats = [await asyncio.to_thread(sim.stats) for sim in woken]
    finally:
        await asyncio.to_thread(proc.stop)
        await tap.close()
    figures = hold_figures(samples, tap.reached, wake)
    return {
        **figures,
        "activator_while_held": {k: held[k] for k in ("requests_held", "upstream_ready")},
        "activator_counters": counters(before, after),
        "activator_after": {k: after[k] for k in ("requests_held", "requests_in_flight")},
        "sims": sim_counts(stats),
        "activator_memory": memory,
    }


def hold_figures(
    samples: Sequence[Sample], reached: Mapping[int, float], wake: Mapping[str, float]
) -> dict[str, Any]:
    """Answers, order and waits of the held requests, and the wake's timeline, in seconds
    after the first one was sent."""
    origin = samples[0].sent_s
    rows = held_rows(samples, reached, origin)
    order = list(reached)
    by_first_byte = sorted(range(len(rows)), key=lambda i: rows[i]["first_byte_s"])
    held = [r["held_s"] for r in rows]
    return {
        "requests": len(samples),
        "answered_200": sum(1 for s in samples if s.ok),
        "router_order": order,
        "router_order_is_arrival_order": order == list(range(len(samples))),
        "first_byte_inversions": inversions(by_first_byte),
        "held_ms": spread_ms(held) | {"max": max(held) * 1e3},
        "timeline_s": {
            "last_request_sent": samples[-1].sent_s - origin,
            "sims_started": wake["started"] - origin,
            "sims_answering": wake["sims_up"] - origin,
            "router_ready": wake["router_ready"] - origin,
            "first_reached_router": min(reached.values(), default=math.nan) - origin,
            "last_reached_router": max(reached.values(), default=math.nan) - origin,
            "last_answered": max(r["ended_s"] for r in rows),
        },
        "rows": rows,
    }


def counters(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    names = ("requests_total", "held_total", "forwarded_total", "expired_total",
             "upstream_errors_total")  # fmt: skip
    return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in names}


def sim_counts(stats: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """What the woken prefill and decode sims did (/sim/stats)."""
    prefill, decode = stats
    return {
        "prefill_requests": prefill["prefill_requests"],
        "kv_pulls": decode["kv_pulls"],
        "kv_pull_failures": decode["kv_pull_failures"],
        "recomputed": decode["recompute_invalid_params"],
    }


# ----- checks and the tables ------------------------------------------------------------------


def checks(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What must hold for the figures to mean anything."""
    hold, expiry, zero = results["hold"], results["expiry"], results["zero"]
    n = hold["requests"]
    sides = [lv[arm] for lv in results["awake"]["latency"] for arm in ARMS]
    unanswered = sum(side["requests"] - side["ok"] for side in sides)
    count = hold["activator_counters"]
    none_lost = (
        count["forwarded_total"] == n
        and count["expired_total"] == 0
        and count["upstream_errors_total"] == 0
    )
    sims_once = hold["sims"]["prefill_requests"] == n and hold["sims"]["kv_pulls"] == n
    expired_ok = (
        expiry["status"] == 503
        and expiry["retry_after"] == expiry["expected_retry_after"]
        and expiry["error_type"] == "service_unavailable"
        and expiry["max_wait_s"] <= expiry["after_s"] <= expiry["max_wait_s"] + 1.0
    )
    expiry_detail = (
        f"{expiry['status']} after {expiry['after_s']:.2f} s, "
        f"Retry-After {expiry['retry_after']}, {expiry['error_type']}"
    )
    found = [
        ("awake: every request answered in full, both ways", unanswered == 0,
         f"{unanswered} not"),
        ("zero: the router alone answers 503 at once", zero["direct"]["status"] == 503,
         f"{zero['direct']['status']} in {zero['direct']['ms']:.1f} ms"),
        (f"hold: all {n} answered 200 in full", hold["answered_200"] == n,
         f"{hold['answered_200']} of {n}"),
        ("hold: they reached the router in arrival order", hold["router_order_is_arrival_order"],
         " ".join(map(str, hold["router_order"]))),
        ("hold: none lost (forwarded, none expired, no upstream error)", none_lost,
         ", ".join(f"{k} {v:g}" for k, v in count.items())),
        ("hold: the woken sims served each once (prefill, KV pull)", sims_once,
         ", ".join(f"{k} {v}" for k, v in hold["sims"].items())),
        ("maxWait: 503 with Retry-After, about maxWait after it came", expired_ok,
         expiry_detail),
    ]  # fmt: skip
    return [{"check": name, "ok": bool(ok), "detail": detail} for name, ok, detail in found]


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f} ms"


def latency_table(levels: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "| Clients | Time to | Router median | Via activator | Added | Ratio "
        "| Router p95 | Via activator | Added | Ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in levels:
        for t, name in TIMES.items():
            d, v, a = level["direct"][f"{t}_ms"], level["activator"][f"{t}_ms"], level["added"][t]
            lines.append(
                f"| {level['concurrency']} | {name} | {_ms(d['median'])} | {_ms(v['median'])} "
                f"| {a['median_ms']:+.2f} ms | {a['median_ratio']:.3f}x | {_ms(d['p95'])} "
                f"| {_ms(v['p95'])} | {a['p95_ms']:+.2f} ms | {a['p95_ratio']:.3f}x |"
            )
    return lines


def throughput_table(levels: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| Clients | Requests/s, router | Requests/s, via activator |", "|---|---|---|"]
    for lv in levels:
        direct, via = lv["direct"]["requests_per_s"], lv["activator"]["requests_per_s"]
        lines.append(f"| {lv['concurrency']} | {direct:.1f} | {via:.1f} |")
    return lines


def memory_table(awake: Mapping[str, Any], hold: Mapping[str, Any]) -> list[str]:
    lines = [
        "| Process | RSS idle | RSS after the load | Peak RSS | CPU a request |",
        "|---|---|---|---|---|",
    ]
    for name, key in (("activator", "activator"), ("vllm-router (for scale)", "router")):
        p = awake[key]
        lines.append(
            f"| {name} | {p['idle']['rss_mb']:.1f} MB | {p['after_load']['rss_mb']:.1f} MB "
            f"| {p['after_load']['hwm_mb']:.1f} MB | {p['cpu_ms_per_request']:.2f} ms |"
        )
    mem = hold["activator_memory"]
    return [
        *lines,
        "",
        f"The activator of the hold: {mem['idle']['rss_mb']:.1f} MB idle, "
        f"{mem['holding']['rss_mb']:.1f} MB holding {hold['requests']} requests, "
        f"{mem['after']['rss_mb']:.1f} MB after them.",
    ]


def zero_section(zero: Mapping[str, Any], expiry: Mapping[str, Any]) -> list[str]:
    direct = zero["direct"]
    return [
        f"Both sims stopped: the router's `/readiness` said 503 "
        f"{zero['readiness_503_after_s']:.1f} s later, and counted no healthy worker after "
        f"{zero['no_healthy_worker_after_s']:.1f} s (`{zero['readiness_body']}`). "
        f"A request straight to the router: **{direct['status']}** in {direct['ms']:.1f} ms "
        f"(`{direct['body']}`).",
        "",
        f"Through an activator with `--max-wait {expiry['max_wait_s']:g}`: "
        f"**{expiry['status']}** after {expiry['after_s']:.2f} s, "
        f"`Retry-After: {expiry['retry_after']}`, `{expiry['message']}`.",
    ]


def hold_section(hold: Mapping[str, Any]) -> list[str]:
    t, held = hold["timeline_s"], hold["held_ms"]
    order = "arrival order" if hold["router_order_is_arrival_order"] else hold["router_order"]
    out = [
        f"Answered 200 in full: **{hold['answered_200']} of {hold['requests']}**. Order in "
        f"which they reached the router: **{order}**; pairs whose first bytes came back out of "
        f"arrival order: {hold['first_byte_inversions']}. While held, the activator's "
        f"`requests_held` was {hold['activator_while_held']['requests_held']:g} and "
        f"`upstream_ready` {hold['activator_while_held']['upstream_ready']:g}. "
        f"Held (sent -> reached the router): "
        f"median {held['median'] / 1e3:.2f} s, max {held['max'] / 1e3:.2f} s.",
        "",
        "| Seconds after the first request was sent | |",
        "|---|---|",
        f"| the last request sent | {t['last_request_sent']:.2f} |",
        f"| the prefill and decode sims started | {t['sims_started']:.2f} |",
        f"| both answer `/health` | {t['sims_answering']:.2f} |",
        f"| the router's `/readiness` says 200 | {t['router_ready']:.2f} |",
        f"| the first request reaches the router | {t['first_reached_router']:.2f} |",
        f"| the last request reaches the router | {t['last_reached_router']:.2f} |",
        f"| the last stream ends | {t['last_answered']:.2f} |",
        "",
        "| # | Sent | Reached the router | Held | First byte | Stream ended | Status | Tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in hold["rows"]:
        out.append(
            f"| {r['seq']} | {r['sent_s']:.3f} | {r['reached_router_s']:.3f} "
            f"| {r['held_s']:.3f} | {r['first_byte_s']:.3f} | {r['ended_s']:.3f} "
            f"| {r['status']} | {r['tokens']} |"
        )
    return out


def header(results: Mapping[str, Any]) -> str:
    s, v, load = results["setup"], results["versions"], results["load_average"]
    return (
        f"`{results['command']}`, {results['date']}, commit {results['commit']}, "
        f"{results['machine']}, load average {load[0]:.2f} at the start and {load[1]:.2f} at "
        f"the end; vllm-router {v['vllm-router']}, aiohttp {v['aiohttp']}, Python "
        f"{v['python']}. Streams of {s['prompt_tokens']} prompt and {s['max_tokens']} output "
        f"tokens to one prefill and one decode `pdfleet-sim` (H200 preset, time scale "
        f"{s['time_scale']:g}); {s['requests']} requests a side at each concurrency in "
        f"{s['blocks']} alternating blocks, after {s['warmup']} warm-up requests a side; each "
        f"client pauses 0 to {s['think_ms']:g} ms (uniform) before each request."
    )


def render_markdown(results: Mapping[str, Any]) -> str:
    awake, hold = results["awake"], results["hold"]
    out = [
        "# Activator: results",
        "",
        header(results),
        "",
        "## Awake: what the activator adds",
        "",
        *latency_table(awake["latency"]),
        "",
        *throughput_table(awake["latency"]),
        "",
        "## Memory and CPU",
        "",
        *memory_table(awake, hold),
        "",
        "## At zero",
        "",
        *zero_section(results["zero"], results["expiry"]),
        "",
        f"## Hold and wake: {hold['requests']} requests",
        "",
        *hold_section(hold),
        "",
        "## Checks",
        "",
        "| Check | Met | Detail |",
        "|---|---|---|",
        *(
            f"| {c['check']} | {'yes' if c['ok'] else '**no**'} | {c['detail']} |"
            for c in results["checks"]
        ),
        "",
    ]
    return "\n".join(out)


# ----- the run --------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, log_dir: Path, procs: list[Proc]) -> dict[str, Any]:
    _log(f"starting a prefill and a decode sim and vllm-router (logs in {log_dir})")
    sims = await asyncio.to_thread(start_pair, log_dir, args.time_scale)
    procs.extend(sims)
    router = await asyncio.to_thread(start_router, log_dir, *sims)
    procs.append(router[0])
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=HOLD_MAX_WAIT_S + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        awake = await measure_awake(session, args, router, log_dir, procs)
        zero = await to_zero(session, router[1], sims)
        expiry = await measure_expiry(session, args, router[1], log_dir, procs)
        hold = await hold_and_wake(session, args, router[1], sims, log_dir, procs)
    return {"awake": awake, "zero": zero, "expiry": expiry, "hold": hold}


def environment(argv: Sequence[str]) -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
        check=False,
    ).stdout.strip()  # fmt: skip
    return {
        "command": " ".join(["python -m e2e.benchmarks.bench_activator", *argv]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit or "unknown",
        "machine": f"{os.cpu_count()} cores ({platform.machine()}), loopback only",
        "versions": {
            "vllm-router": metadata.version("vllm-router"),
            "aiohttp": metadata.version("aiohttp"),
            "python": platform.python_version(),
        },
    }


SETUP = ("requests", "concurrency", "blocks", "warmup", "think_ms", "prompt_tokens",
         "max_tokens", "time_scale", "held", "hold_s", "max_wait")  # fmt: skip


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m e2e.benchmarks.bench_activator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--requests", type=int, default=200, help="a side, at each concurrency")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--blocks", type=int, default=4, help="alternating blocks a side")
    p.add_argument("--warmup", type=int, default=16, help="requests a side, not counted")
    p.add_argument("--think-ms", type=float, default=50.0, help="most a client pauses")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1.0, help="the sims' (1.0: real time)")
    p.add_argument("--settle-s", type=float, default=2.0, help="after the activator starts")
    p.add_argument("--held", type=int, default=20, help="requests held while at zero")
    p.add_argument("--hold-s", type=float, default=1.0, help="held this long before the wake")
    p.add_argument("--max-wait", type=float, default=3.0, help="maxWait of the expiry case")
    p.add_argument("--out", type=Path, default=OUT_DIR)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="pdfleet-bench-activator-"))
    load_start = os.getloadavg()[0]
    procs: list[Proc] = []
    with stopping(procs):
        figures = asyncio.run(measure(args, log_dir, procs))
    results: dict[str, Any] = {
        **environment(argv),
        "load_average": [load_start, os.getloadavg()[0]],
        "setup": {key: getattr(args, key) for key in SETUP},
        **figures,
        "logs": str(log_dir),
    }
    results["checks"] = checks(results)
    table = render_markdown(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(table)
    print(table)
    return 0 if all(c["ok"] for c in results["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
