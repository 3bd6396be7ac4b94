"""The KV transport preflight between two processes over real NIXL and UCX (TCP on loopback).

Two `pdfleet-agent preflight-serve` listeners, as the agent runs them in a prefill and a decode pod,
bound to two pod-CIDR addresses of the private network namespace. The test asks the "decode"
listener to measure against the "prefill" one, exactly as the operator does: the decode side READs a
Llama-3.1-8B-shaped KV payload in host memory (1,024 tokens, 128 MiB, 4,096 descriptors) over
UCX_TLS=tcp on `lo`, verifies it, and reports the transport UCX says it used. Run inside the
namespace: e2e/platform/netns.sh .venv/bin/pytest tests/integration/preflight
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from e2e.platform.cluster import in_private_netns, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PREFILL_IP, DECODE_IP = "10.244.250.1", "10.244.250.2"
PORT = 5590
AGENT = str(Path(sys.executable).parent / "pdfleet-agent")
UCX_TCP = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}
REQUEST = {
    "peer": f"http://{PREFILL_IP}:{PORT}",
    "tokens": 1024,
    "blockSize": 16,
    "geometry": {"layers": 32, "kvHeads": 8, "headDim": 128, "dtypeBytes": 2},
    "iterations": 3,
    "timeoutSeconds": 240,
}


@pytest.fixture(scope="module")
def side_channel() -> Iterator[str]:
    """A listening socket where the prefill's NIXL side channel would be."""
    if not in_private_netns():
        pytest.fail(
            "run inside the private network namespace: "
            "e2e/platform/netns.sh .venv/bin/pytest tests/integration/preflight",
            pytrace=False,
        )
    with socket.create_server((PREFILL_IP, 5600)) as server:
        yield f"{PREFILL_IP}:5600"
        server.close()


def _listener(ip: str, log: Path, extra: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(log.parent),
        "PDFLEET_POD_IP": ip,
        "PDFLEET_PREFLIGHT_PORT": str(PORT),
        "PDFLEET_ENGINE": "sim",  # the simulator's KV lives in host memory
        **UCX_TCP,
        **extra,
    }
    with log.open("wb") as out:
        return subprocess.Popen([AGENT, "preflight-serve"], env=env, stdout=out, stderr=out)


def _up(ip: str) -> bool:
    try:
        return httpx.get(f"http://{ip}:{PORT}/preflight/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def listeners(
    side_channel: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    logs = tmp_path_factory.mktemp("preflight")
    host, _, port = side_channel.rpartition(":")
    procs = [
        _listener(
            PREFILL_IP,
            logs / "prefill.log",
            {"VLLM_NIXL_SIDE_CHANNEL_HOST": host, "VLLM_NIXL_SIDE_CHANNEL_PORT": port},
        ),
        _listener(DECODE_IP, logs / "decode.log", {}),
    ]
    try:
        wait_until(lambda: _up(PREFILL_IP) and _up(DECODE_IP), 60, "both listeners up")
        yield {"prefill": procs[0], "decode": procs[1]}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)


def _run(body: dict[str, object]) -> dict[str, object]:
    response = httpx.post(f"http://{DECODE_IP}:{PORT}/preflight/run", json=body, timeout=300)
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    return result


def test_decode_reads_the_prefill_kv_over_ucx_tcp(listeners: object) -> None:
    result = _run(REQUEST)
    assert result["ok"] and result["verified"], result["error"]
    assert result["memory"] == "DRAM"
    assert (result["transport"], result["transport_kind"]) == ("tcp/lo", "tcp")
    assert result["total_bytes"] == 1024 * 131_072
    assert (result["descriptors"], result["descriptor_bytes"]) == (2 * 32 * 64, 32_768)
    seconds = result["seconds"]
    assert isinstance(seconds, list) and len(seconds) == 3 and all(s > 0 for s in seconds)
    bandwidth = result["bandwidth_bytes_per_s"]
    latency = result["latency_s"]
    assert isinstance(bandwidth, float) and bandwidth > 0
    assert isinstance(latency, float) and latency > 0
    assert result["extra"] == {"sideChannel": f"{PREFILL_IP}:5600", "sideChannelReachable": True}
    print(f"\nloopback UCX tcp/lo: {bandwidth / 1e9:.3f} GB/s, {latency * 1e3:.2f} ms per block")


def test_an_unreachable_prefill_is_a_failed_result_and_the_listener_stays_up(
    listeners: object,
) -> None:
    result = _run({**REQUEST, "peer": "http://10.244.250.3:5590"})
    assert not result["ok"] and "10.244.250.3" in str(result["error"])
    assert _up(DECODE_IP)


def test_a_bad_request_is_refused(listeners: object) -> None:
    response = httpx.post(f"http://{DECODE_IP}:{PORT}/preflight/run", json={}, timeout=30)
    assert response.status_code == 400 and "KeyError" in response.json()["error"]


def _threads(proc: subprocess.Popen[bytes]) -> int:
    return len(os.listdir(f"/proc/{proc.pid}/task"))


def test_the_prefill_listener_keeps_no_nixl_agent_between_runs(
    listeners: dict[str, subprocess.Popen[bytes]],
) -> None:
    # NIXL's progress thread polls without a pause while its agent lives: a listener that kept
    # the agent after a run would hold a busy core beside the engine for the pod's lifetime
    prefill = listeners["prefill"]
    idle = _threads(prefill)
    assert _run(REQUEST)["ok"]
    wait_until(lambda: _threads(prefill) <= idle, 15, "the prefill listener's threads back to idle")
