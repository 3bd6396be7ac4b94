"""KV transport preflight: prove the NIXL path between a prefill and a decode pod.

`plan` is pure (payload geometry, UCX transport from its protocol report, the result record);
`transfer` does the NIXL work; `server` is the small HTTP listener the agent runs beside the
engine. docs/kv-preflight.md describes the check and what to do when it fails.
"""
