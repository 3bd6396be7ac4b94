"""Fixtures for the Prometheus tests.

``bridge_cluster`` and ``api_client`` (session) come from tests/e2e/support.py; only
test_kubernetes_sd.py uses them (marked ``e2e``: run the folder inside the private network
namespace, ``e2e/platform/netns.sh .venv/bin/pytest tests/integration/prometheus``). The other tests
run simulators and Prometheus on 127.0.0.1.
"""

from __future__ import annotations

from tests.e2e.support import api_client, bridge_cluster

__all__ = ["api_client", "bridge_cluster"]
