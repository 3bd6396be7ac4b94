"""pdfleet-sim held to real vLLM: the same probe requests to a real prefill/decode pair of the
cluster and to a simulator pair started from the same pods' containers and env, and everything the
operator and the router can observe of the two compared (e2e/scenarios/differential.py lists what is
compared and what differs on purpose). Any new divergence fails here.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from e2e.platform.real_engine import SERVED_MODEL, Pace, pod_urls, wait_serving
from e2e.platform.service import Service
from e2e.scenarios.differential import differences, drain_answers, observe, sim_pair, to_json
from pdfleet import labels

#: Above wait_serving's 600 s: an engine a test stopped comes back through the bridge's
#: restart, and a pool that does not should fail with wait_serving's reason.
pytestmark = pytest.mark.timeout(900)


def test_the_simulator_shows_what_the_engine_shows(
    service: Service, pace: Pace, tmp_path: Path
) -> None:
    wait_serving(service)
    (prefill_pod,) = service.role_pods(labels.ROLE_PREFILL)
    decode_pod = service.role_pods(labels.ROLE_DECODE)[0]
    prefill = pod_urls(service, labels.ROLE_PREFILL)[prefill_pod["metadata"]["name"]]
    decode = pod_urls(service, labels.ROLE_DECODE)[decode_pod["metadata"]["name"]]
    real = observe(prefill, decode, SERVED_MODEL, pace.timeout_s())
    with sim_pair(prefill_pod, decode_pod, tmp_path) as pair:
        sim = observe(pair.prefill, pair.decode, SERVED_MODEL)
    (tmp_path / "observations.json").write_text(
        json.dumps({"vllm": to_json(real), "sim": to_json(sim)}, indent=1)
    )
    found = differences(sim, real)
    assert not found, "\n".join(found)


def test_a_draining_simulator_answers_as_a_draining_engine(
    service: Service, pace: Pace, tmp_path: Path
) -> None:
    """SIGTERM with a stream in flight: vLLM refuses a new request with HTTP 500 ("cannot
    schedule new futures after shutdown") while /health and /metrics still answer 200 and
    the stream ends complete; the simulator must answer the same. The decode pod's engine
    is stopped as kubelet stops a container (no liveness probe cuts its drain short) and
    restarted; every test waits for the pools it needs."""
    wait_serving(service)
    (prefill_pod,) = service.role_pods(labels.ROLE_PREFILL)
    decode_pod = service.role_pods(labels.ROLE_DECODE)[0]
    name = decode_pod["metadata"]["name"]
    url = pod_urls(service, labels.ROLE_DECODE)[name]
    bridge = service.bridge
    assert bridge is not None
    real = drain_answers(
        url, SERVED_MODEL, lambda: bridge.stop_container(service.namespace, name), pace.timeout_s()
    )
    with sim_pair(prefill_pod, decode_pod, tmp_path) as pair:
        sim = drain_answers(
            pair.decode, SERVED_MODEL, lambda: pair.decode_process.send_signal(signal.SIGTERM)
        )
    print(json.dumps({"vllm": real, "sim": sim}))
    assert real["new request"] == "500 cannot schedule new futures after shutdown", real
    assert real["/health"] == real["/metrics"] == "200", real
    assert sim == real
