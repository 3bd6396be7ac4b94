"""The operator's one HTTP client for pods and routers (KV preflight, drain reads).

Where it fits: `preflight.io` and `drain.io` send their requests through `shared()` instead of
a client per call. httpx builds an SSL context for every new client, even for plain-HTTP
URLs, CPU spent much of it holding the GIL. With a client per call, a large fleet's KV
preflight retries alone (one per service per minute) would take much of the operator's CPU
and delay the event loop that turns watch events into passes (docs/benchmarks/scale). One
client also keeps connections to routers alive between a drain's passes. httpx clients are
safe to share between threads.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

# Pages a reconcile pass waits for (routers, engines) must answer quickly; a call that may
# take longer (the KV preflight) gives its own timeout.
TIMEOUT = httpx.Timeout(2.0, connect=1.0)


@functools.cache
def shared() -> httpx.Client:
    """The process-wide client."""
    return httpx.Client(timeout=TIMEOUT)


# A host that let a request time out is not asked again for this long. A drain polls its
# router and workers every half second; a router that accepts connections and never answers
# would otherwise cost every pass of that service the whole timeout again.
SILENT_FOR_S = 30.0


class SilentHosts:
    """Hosts (scheme://host:port) that recently let a request time out, and until when."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def origin(url: str) -> str:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}"

    def silent(self, url: str) -> bool:
        with self._lock:
            until = self._until.get(self.origin(url))
            if until is not None and until <= self._clock():
                del self._until[self.origin(url)]
                return False
            return until is not None

    def timed_out(self, url: str) -> None:
        with self._lock:
            self._until[self.origin(url)] = self._clock() + SILENT_FOR_S


#: The operator's memory of silent hosts, shared like its client.
SILENT = SilentHosts()
