"""The autoscaler's offline benchmark lab: a fleet simulator, trace loaders, baseline
autoscalers, the clairvoyant bound and the benchmark runner (`python -m pdfleet_lab.bench`).

It drives `pdfleet.autoscale.policy` exactly as the operator does, with the worker's
performance model (`pdfleet_worker.perfmodel`) as the engines. The operator never imports it,
and the operator image does not carry it (operator/Dockerfile).
"""
