"""Scale to zero and back: the activator in front of a sleeping service's router.

`hold` is the pure policy (hold, release in arrival order, expire, idleness), `proxying` the
pure rules of the proxy (which headers pass, the activator's own answers), `server` the one
I/O layer (aiohttp: listen, poll the router's /readiness, forward, stream, `/metrics`).
The activator holds no API credentials: the operator reads its `/metrics` (requests held: a
wake; nothing in flight since idleAfter: idle) and does the waking and the sleeping.
docs/design/scale-to-zero.md is the plan, and says what is built and what is not wired yet.
"""
