"""The operator's one HTTP client for pods and routers (KV preflight, drain reads).

Where it fits: `preflight.io` and `drain.io` send their requests through `shared()` instead of
a client per call. httpx builds an SSL context for every new client, even for plain-HTTP
URLs: about 50 ms of CPU, much of it holding the GIL. At 1,000 services the KV preflight
retries alone (one per service per minute) then cost most of a core and delayed the event
loop that turns watch events into passes. One client also keeps connections to routers
alive between a drain's passes. httpx clients are safe to share between threads.
"""

from __future__ import annotations

import functools

import httpx

# Pages a reconcile pass waits for (routers, engines) must answer quickly; a call that may
# take longer (the KV preflight) gives its own timeout.
TIMEOUT = httpx.Timeout(2.0, connect=1.0)


@functools.cache
def shared() -> httpx.Client:
    """The process-wide client."""
    return httpx.Client(timeout=TIMEOUT)
