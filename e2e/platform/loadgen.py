"""Load generator: streaming completions through the router, one record per request.

Where it fits: the demo, the e2e scenarios and the drain tests drive a fleet with it. A load
is a list of phases (duration, arrival rate, prompt and output lengths); arrivals are Poisson
and every request streams, so the client measures what a user sees: TTFT, mean ITL, and the
outcome (ok, error, or truncated: a stream that ended before `[DONE]` or short of its tokens).
Request loops are bounded in count and time. With a simulator running slower or faster than
real time (`time_scale`), measured seconds are converted back to simulated seconds.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import httpx

OK, ERROR, TRUNCATED = "ok", "error", "truncated"


@dataclass(frozen=True)
class Phase:
    """`duration_s` of Poisson arrivals at `rate` requests/s (wall clock)."""

    name: str
    duration_s: float
    rate: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Record:
    phase: str
    start_s: float
    outcome: str
    ttft_s: float = math.nan
    itl_s: float = math.nan
    tokens: int = 0
    detail: str = ""
    end_s: float = math.nan  # when the request ended, seconds from the run's start


def prompt_of(tokens: int) -> str:
    """A prompt the simulator counts as exactly `tokens` tokens (one per word)."""
    return "hi " * tokens


def arrivals(phases: Sequence[Phase], seed: int = 1) -> list[tuple[float, Phase]]:
    """Pure: Poisson arrival times (seconds from start) for every phase, in order."""
    rng = random.Random(seed)
    out: list[tuple[float, Phase]] = []
    offset = 0.0
    for phase in phases:
        t = 0.0
        while phase.rate > 0:
            t += rng.expovariate(phase.rate)
            if t >= phase.duration_s:
                break
            out.append((offset + t, phase))
        offset += phase.duration_s
    return out


def parse_stream_line(line: str) -> tuple[bool, int]:
    """(done, tokens) for one SSE line of an OpenAI completions stream."""
    if not line.startswith("data:"):
        return False, 0
    data = line[5:].strip()
    if data == "[DONE]":
        return True, 0
    chunk = json.loads(data)
    choices = chunk.get("choices") or []
    return False, sum(1 for c in choices if c.get("text"))


def streamed_text(lines: Iterable[str], chat: bool = False) -> str:
    """The text of a whole SSE completion stream (chat deltas with `chat`); an error chunk or
    a stream that ends without `[DONE]` raises, so a test sees the engine's own message."""
    parts: list[str] = []
    for line in lines:
        if line == "data: [DONE]":
            return "".join(parts)
        if line.startswith("data: "):
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise ValueError(f"error chunk in stream: {chunk}")
            for c in chunk["choices"]:
                parts.append((c["delta"].get("content") or "") if chat else c["text"])
    raise ValueError(f"stream ended without [DONE] after {''.join(parts)!r}")


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    phase: Phase,
    started: float,
    time_scale: float,
) -> Record:
    body = {
        "model": model,
        "prompt": prompt_of(phase.prompt_tokens),
        "max_tokens": phase.output_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    t0 = time.monotonic()
    first: float | None = None
    last = t0
    tokens = 0
    done = False
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                return Record(phase.name, started, ERROR, detail=f"{response.status_code} {text}")
            async for line in response.aiter_lines():
                finished, count = parse_stream_line(line)
                if count:
                    now = time.monotonic()
                    first = first if first is not None else now
                    last = now
                    tokens += count
                done = done or finished
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        return Record(phase.name, started, ERROR, tokens=tokens, detail=type(error).__name__)
    if not done or tokens < phase.output_tokens or first is None:
        return Record(phase.name, started, TRUNCATED, tokens=tokens)
    ttft = (first - t0) / time_scale
    itl = (last - first) / max(tokens - 1, 1) / time_scale
    return Record(phase.name, started, OK, ttft, itl, tokens)


@dataclass
class LoadRun:
    """Replays phases against a router URL; records land in `records` as they finish."""

    url: str
    model: str
    phases: Sequence[Phase]
    time_scale: float = 1.0
    max_in_flight: int = 256
    timeout_s: float = 300.0
    seed: int = 1
    records: list[Record] = field(default_factory=list)
    on_record: Callable[[Record], None] | None = None

    async def run(self) -> list[Record]:
        limits = httpx.Limits(max_connections=self.max_in_flight, max_keepalive_connections=64)
        timeout = httpx.Timeout(self.timeout_s, connect=10.0)
        gate = asyncio.Semaphore(self.max_in_flight)
        start = time.monotonic()

        async def fire(client: httpx.AsyncClient, at: float, phase: Phase) -> None:
            async with gate:
                record = await one_request(client, self.url, self.model, phase, at, self.time_scale)
            record = replace(record, end_s=time.monotonic() - start)
            self.records.append(record)
            if self.on_record is not None:
                self.on_record(record)

        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            tasks = []
            for at, phase in arrivals(self.phases, self.seed):
                delay = start + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(fire(client, at, phase)))
            await asyncio.gather(*tasks)
        return self.records


def summarize(records: Sequence[Record]) -> dict[str, float]:
    """Counts and latency percentiles (simulated seconds) of a run."""
    ok = [r for r in records if r.outcome == OK]

    def pct(values: list[float], q: float) -> float:
        if not values:
            return math.nan
        return (
            statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]
            if len(values) > 1
            else values[0]
        )

    ttfts = [r.ttft_s for r in ok]
    itls = [r.itl_s for r in ok]
    return {
        "requests": float(len(records)),
        "ok": float(len(ok)),
        "errors": float(sum(1 for r in records if r.outcome == ERROR)),
        "truncated": float(sum(1 for r in records if r.outcome == TRUNCATED)),
        "ttft_p50_s": pct(ttfts, 50),
        "ttft_p90_s": pct(ttfts, 90),
        "itl_p50_s": pct(itls, 50),
        "itl_p90_s": pct(itls, 90),
    }
