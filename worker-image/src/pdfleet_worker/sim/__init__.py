"""A vLLM-faithful worker simulator: the OpenAI API, /metrics and the NIXL P/D protocol.

Where it fits: tests, the demo and the benchmarks run `pdfleet-sim` wherever a real vLLM
worker would run (the process bridge binds it to a pod IP), so the operator, the router and
the autoscaler see what vLLM 0.33 would show them without a GPU. See docs/simulator.md.
"""
