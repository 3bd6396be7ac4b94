"""Scale to zero and back: the activator in front of a sleeping service's router.

`hold` is the pure policy (hold, release in arrival order, expire, when to wake, idleness),
`proxying` the pure rules of the proxy (which headers pass, the activator's own answers),
`server` the one I/O layer (aiohttp: listen, poll the router's /readiness, forward, stream),
`wake` the signal to the operator (an annotation on the InferenceService).
docs/design/scale-to-zero.md is the plan, and says what is built and what is not wired yet.
"""
