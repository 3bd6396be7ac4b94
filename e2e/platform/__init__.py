"""The local cluster and everything that runs a fleet on it.

The pinned Kubernetes toolchain (``toolchain.sh``), the private network namespace
(``netns.sh``), the kwok cluster (``cluster.py``, ``kwok/``), the process bridge that runs
pods as local processes (``bridge/``), the operator as a real process
(``operator_process.py``), Prometheus and the proxies that inject faults
(``prometheus.py``, ``prometheus_proxy.py``, ``fault_proxy.py``), a deployed service and its
readiness (``service.py``), the demo fleet (``fleet.py``), load generators (``loadgen.py``,
``closed_loop.py``), convergence checks (``children.py``), summary statistics (``stats.py``)
and the real vLLM engine (``real_engine.py``, ``engine.sh``, ``engine-bin/``,
``tiny_model.py``). Nothing here imports a scenario or a benchmark.
"""
