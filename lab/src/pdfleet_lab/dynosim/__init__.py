"""pdfleet's autoscaling policy inside DynoSim, Dynamo's replay simulator (issue #25 step 4).

Where it fits: `make bench-autoscale-dynosim` installs DynoSim in a venv of its own
(`lab/dynosim/setup.sh`, outside the checkout) and runs `python -m pdfleet_lab.dynosim`
there. The simulator is independent of `pdfleet_lab.sim`: its engines, router, KV transfer and
start-up are Dynamo's (the Rust "mocker"); its timing is an interpolation table built from
aiconfigurator-core. pdfleet's policy drives its fleet through the planner hook of DynoSim's
offline replay and reads its windows as the operator does: the operator's PromQL, through
`pdfleet.autoscale.metrics.PrometheusSource`, over vLLM metric families scraped every 15 s
into `pdfleet_lab.tsdb.SimPrometheus`.

Modules:
- `table`: the timing table (grid, interpolation, capacity priors); pure.
- `signals`: DynoSim's per-tick data (forward-pass snapshots, traffic window) into the vLLM
  metric families of `pdfleet_lab.exporter.EngineFamilies`; pure.
- `ticker`: the object DynoSim calls once per tick; runs a `pdfleet_lab.sim.Controller`; pure.
- `results`: attainment, flaps, ratios, result rows and the Markdown table; pure.
- `runtime`: the only module that imports `dynamo` and `aiconfigurator_core` (one run, the
  table build), run in a subprocess with a wall-time cap.
- `harness` (`__main__`): the benchmark: pdfleet with and without a capacity hint, fixed
  splits and the clairvoyant bound (`pdfleet_lab.oracle`'s search on a DynoSim runner).
"""
