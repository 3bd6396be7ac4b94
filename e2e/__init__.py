"""The end-to-end harness, by role: ``platform`` (the local cluster and everything that runs
a fleet on it), ``scenarios`` (end-to-end proofs and the demo built on the platform) and
``benchmarks`` (measurements on it). A platform module imports no scenario or benchmark, and
a scenario no benchmark (checked by lint-imports)."""
