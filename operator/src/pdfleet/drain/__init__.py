"""Scale-down without losing a request: drain, deregister from the router, then remove.

`plan` is the pure state machine, `io` the router and worker HTTP, `executor` carries a plan
out. docs/drain.md explains the states, the signals and what vllm-router can and cannot do.
"""
