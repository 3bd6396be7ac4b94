"""Local control plane, process bridge, end-to-end scenarios and benchmarks."""
