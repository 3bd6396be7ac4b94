"""Closed-loop streaming clients: N threads, each sending its next completion when the last ends.

Where it fits: the drain proofs (tests/integration/router/test_drain_router.py against the router
alone, e2e/scenarios/drain_scenario.py and tests/e2e/drain on the local cluster) need a steady
stream of in-flight requests at the moment a worker leaves, and every request's outcome.
e2e/platform/loadgen.py is the open-loop (Poisson) generator the autoscaling scenarios use.

An outcome is `ok` only with `[DONE]` and every token asked for; an HTTP error or an error
chunk is `failed`, a stream that broke off is `truncated` once a token arrived (`failed`
before). Times are epoch seconds, as the operator's timestamps are.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True)
class Result:
    started: float  # epoch seconds
    ended: float
    outcome: str  # ok | failed | truncated
    detail: str = ""


@dataclass(frozen=True)
class Shape:
    """Request sizes, drawn uniformly: prompt tokens and max_tokens."""

    prompt: tuple[int, int] = (100, 2000)
    output: tuple[int, int] = (16, 160)


def read_stream(lines: Iterator[str], max_tokens: int) -> tuple[str, str]:
    """(outcome, detail) of one SSE completion stream: ok only with [DONE] and every token.

    Tokens are the usage chunk's count when the stream has one (`stream_options`), else the
    words of the text (the simulator writes one word a token)."""
    tokens, done = 0, False
    usage: int | None = None
    for line in lines:
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return "failed", str(chunk)[:200]
            tokens += sum(len(c.get("text", "").split()) for c in chunk.get("choices", ()))
            if chunk.get("usage"):
                usage = int(chunk["usage"]["completion_tokens"])
    tokens = tokens if usage is None else usage
    outcome = "ok" if done and tokens == max_tokens else "truncated"
    return outcome, f"{tokens}/{max_tokens} done={done}"


def stream_once(
    client_: httpx.Client,
    url: str,
    prompt_tokens: int,
    max_tokens: int,
    model: str = MODEL,
    extra: Mapping[str, Any] | None = None,
) -> Result:
    """One streaming completion to `url`; never raises for what the server or network does.
    `extra` joins the request body (e.g. the real engine's `ignore_eos`)."""
    body = {
        "model": model,
        "prompt": "tok " * prompt_tokens,
        "max_tokens": max_tokens,
        **(extra or {}),
    }
    started = time.time()
    lines: list[str] = []
    try:
        with client_.stream("POST", url, json={**body, "stream": True}) as resp:
            if resp.status_code != 200:
                resp.read()
                return Result(started, time.time(), "failed", f"{resp.status_code} {resp.text}")
            for line in resp.iter_lines():
                lines.append(line)
    except httpx.HTTPError as error:
        _, detail = read_stream(iter(lines), max_tokens)
        cut = "truncated" if any(line.startswith("data: ") for line in lines) else "failed"
        return Result(started, time.time(), cut, f"{error!r} {detail}")
    outcome, detail = read_stream(iter(lines), max_tokens)
    return Result(started, time.time(), outcome, detail)


def count(results: Sequence[Result], outcome: str) -> int:
    return sum(1 for r in results if r.outcome == outcome)


class Load:
    """`clients` threads streaming completions until stopped (or `limit` results).

    With several routers, each client takes them in turn (starting at its own index), so
    every router replica carries requests. `routers` may be a function that lists them
    afresh for every request, as a Service's endpoints follow a router that rolls.
    """

    def __init__(
        self,
        routers: str | Sequence[str] | Callable[[], Sequence[str]],
        clients: int = 4,
        shape: Shape = Shape(),
        limit: int = 100_000,
        model: str = MODEL,
        timeout_s: float = 60.0,
        extra: Mapping[str, Any] | None = None,
    ):
        if callable(routers):
            self._routers: Callable[[], Sequence[str]] = routers
        else:
            fixed = [routers] if isinstance(routers, str) else list(routers)
            self._routers = lambda: fixed
        self.shape, self.limit, self.model, self.timeout_s = shape, limit, model, timeout_s
        self.extra = dict(extra or {})
        self.results: list[Result] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)
        ]

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        n = seed
        with httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=2.0)) as http:
            while not self._stop.is_set() and len(self.results) < self.limit:
                routers = self._routers()
                url = f"{routers[n % len(routers)]}/v1/completions"
                n += 1
                result = stream_once(
                    http, url, rng.randint(*self.shape.prompt), rng.randint(*self.shape.output),
                    self.model, self.extra,
                )  # fmt: skip
                with self._lock:
                    self.results.append(result)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 30)

    def snapshot(self) -> list[Result]:
        with self._lock:
            return list(self.results)

    def count(self, outcome: str) -> int:
        return count(self.snapshot(), outcome)
