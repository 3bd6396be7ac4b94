"""End-to-end scenarios on the platform: the demo (``demo.py``, ``demo-fleet.yaml``), the
drain under load (``drain_scenario.py``), the fault suite (``faults.py``) and the simulator
held to the real engine (``differential.py``). They import the platform, never a benchmark.
"""
