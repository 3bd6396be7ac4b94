"""The real vLLM engine on the local cluster: its install, a service that runs it, and what
the engines themselves record.

Where it fits: the real-engine tier (tests/e2e/engine, ``make test-engine``). e2e/platform/engine.sh
installs vLLM's CPU build and a tiny random-weight model outside the checkout; the process
bridge runs every worker pod whose image matches ``e2e.platform.bridge.REAL_ENGINE_IMAGE`` as that
engine, started by the pod's own ``pdfleet-agent launch`` with the command line and env the
operator rendered. What the tier asserts is read from vLLM's /metrics and answers, the
router's metrics and the operator's status, never from the test's own bookkeeping.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from e2e.platform.cluster import REPO_ROOT, Cluster, wait_until
from e2e.platform.service import Service, operated_namespace, wait_settled
from pdfleet import labels

ENGINE_SH = REPO_ROOT / "e2e" / "platform" / "engine.sh"
#: Matches e2e.platform.bridge.REAL_ENGINE_IMAGE: the bridge runs these pods as real vLLM.
IMAGE = "ghcr.io/pdfleet/pdfleet-worker-cpu:0.32.0"
SERVED_MODEL = "tiny-llama"
#: The tiny model's KV geometry (e2e/platform/tiny_model.py), so the preflight moves what vLLM
#: would.
GEOMETRY = {"layers": 2, "kvHeads": 2, "headDim": 32, "dtype": "bfloat16"}
#: Greedy-free sampling can end a random model's answer at EOS on any token; the tier asks
#: for exactly max_tokens, and the usage chunk says how many came.
EXACT_LENGTH = {"ignore_eos": True, "stream_options": {"include_usage": True}}
ONE_PREFILL_TWO_DECODES = {labels.ROLE_PREFILL: 1, labels.ROLE_DECODE: 2}


class EngineMissingError(RuntimeError):
    """e2e/platform/engine.sh has not installed the engine (the message says how)."""


def engine_root() -> Path:
    """The engine's install root; EngineMissingError unless e2e/platform/engine.sh completed it."""
    check = subprocess.run([str(ENGINE_SH), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        raise EngineMissingError(
            f"{check.stderr.strip()}; run `make engine` (e2e/platform/engine.sh)"
        )
    root = subprocess.run(
        [str(ENGINE_SH), "--print-root"], capture_output=True, text=True, check=True
    )
    return Path(root.stdout.strip())


def service_manifest(
    namespace: str, root: Path, counts: Mapping[str, int], prometheus_url: str
) -> dict[str, Any]:
    """An InferenceService of the real engine: the tiny model from the engine cache, NIXL
    over UCX's TCP transport on the namespace's loopback, the preflight sized to the
    model, and the autoscaler reading Prometheus with its bounds pinned to ``counts``."""
    pools = {role: {"replicas": {"min": n, "max": n, "initial": n}} for role, n in counts.items()}
    return {
        "apiVersion": f"{labels.GROUP}/{labels.VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": "tiny", "namespace": namespace},
        "spec": {
            "model": {
                "name": SERVED_MODEL,
                "source": {"hub": {"id": str(root / "model")}},
                "maxModelLen": 2048,
            },
            "engine": {"image": IMAGE},
            "kvTransfer": {
                "bufferDevice": "cpu",
                # Two CPU engines share two cores: a decode can take longer than vLLM's 30 s
                # default to start a request whose KV a prefill holds for it.
                "leaseSeconds": 300,
                "fabric": {"ucx": {"tls": "tcp", "netDevices": "lo"}},
                "preflight": {"promptTokens": 512, "iterations": 3, "geometry": GEOMETRY},
            },
            **pools,
            "router": {"healthCheckInterval": "2s"},
            "drain": {"timeout": "60s"},
            "slo": {
                "ttft": {"target": "2s", "percentile": 90},
                "itl": {"target": "200ms", "percentile": 90},
                "window": "60s",
            },
            "autoscaling": {
                "enabled": True,
                "gpuBudget": 8,
                "interval": "10s",
                "prometheus": {"url": prometheus_url},
            },
        },
    }


@contextlib.contextmanager
def deployed_engine_service(
    cluster: Cluster,
    api: Any,
    log_dir: Path,
    root: Path,
    prometheus_url: str,
    counts: Mapping[str, int] = ONE_PREFILL_TWO_DECODES,
    ready_timeout_s: float = 900.0,
) -> Iterator[Service]:
    """The real-engine service at ``counts``, Ready, reconciled by a real operator process;
    everything removed afterwards."""
    with operated_namespace(cluster, api, log_dir, "engine", engine_root=root) as operated:
        service = Service(api, operated.namespace, log_dir, name="tiny", bridge=operated.bridge)
        service.custom.create_namespaced_custom_object(
            labels.GROUP, labels.VERSION, operated.namespace, labels.PLURAL,
            service_manifest(operated.namespace, root, counts, prometheus_url),
        )  # fmt: skip
        # The router turns Ready only once workers are (its /readiness follows them).
        router_ip = partial(_has_ip, service, labels.ROLE_ROUTER)
        wait_until(router_ip, 180, "router pod running")
        wait_settled(service, counts, ready_timeout_s)
        warm_up(service)
        yield service


#: The warm-up's longest prompt, in words (the tiny tokenizer makes about one token each).
WARM_UP_WORDS = (8, 300)
#: Tries per warm-up request: the first request of a shape can fault on its own (below).
WARM_UP_TRIES = 3


def warm_up(service: Service) -> None:
    """A few requests of each kind through the router, then idle engines. A CPU engine's
    first requests of a shape compile kernels for seconds; on a loaded machine a decode
    then reads its KV after the prefill's 30 s lease, which the tests count as a fault.
    Such a request is tried again here, since a warm-up exists to absorb it; one that
    fails every try stops the tier with the router's answer and the engines' errors."""
    body = {"model": SERVED_MODEL, "max_tokens": 8, "ignore_eos": True}
    with httpx.Client(timeout=300) as http:
        for words in WARM_UP_WORDS:
            prompt = " ".join(str(i) for i in range(words))
            for path, extra in (
                ("/v1/completions", {"prompt": prompt}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}),
            ):
                for stream in (False, True):
                    request = {**body, **extra, "stream": stream}
                    _warm_up_request(http, f"{service.router()}{path}", request, service.log_dir)
    wait_engines_idle(
        {**pod_urls(service, labels.ROLE_PREFILL), **pod_urls(service, labels.ROLE_DECODE)}
    )


def _warm_up_request(http: httpx.Client, url: str, request: dict[str, Any], logs: Path) -> None:
    answers = []
    for _ in range(WARM_UP_TRIES):
        response = http.post(url, json=request)
        if response.is_success:
            return
        answers.append(f"{response.status_code} {response.text[:400]}")
        time.sleep(2.0)
    raise RuntimeError(
        f"warm-up POST {url} (stream={request['stream']}) failed {WARM_UP_TRIES} times: "
        + " | ".join(answers)
        + "\n"
        + error_lines(logs)
    )


def error_lines(log_dir: Path, per_file: int = 12) -> str:
    """The last error lines of every router and engine log the bridge kept under `log_dir`:
    what a failure message carries when the logs themselves will not outlive the run."""
    excerpts = []
    for log in sorted(log_dir.glob("*/*.log")):
        lines = log.read_text(errors="replace").splitlines()
        errors = [line for line in lines if "ERROR" in line or "Error" in line]
        if errors:
            excerpts.append(f"--- {log.parent.name}/{log.name}\n" + "\n".join(errors[-per_file:]))
    return "\n".join(excerpts) or f"(no error lines in the logs under {log_dir})"


#: What vLLM names its processes (setproctitle) and how its API server is started.
_VLLM_PROCESS_MARKS = ("VLLM::", "bin/vllm serve")


def engine_stacks(py_spy: str | None = None) -> str:
    """The Python stacks of every vLLM process on the machine (API servers, engine cores,
    workers), from py-spy: what a request stuck inside an engine was waiting on. The tier's
    stalls last until the next request reaches the engines, so a dump taken when a test
    fails on one still shows it."""
    spy = py_spy or shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    dumps = []
    for proc in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            cmdline = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # exited meanwhile
            continue
        if not any(mark in cmdline for mark in _VLLM_PROCESS_MARKS):
            continue
        try:
            dump = subprocess.run(
                [spy, "dump", "--pid", proc.name], capture_output=True, text=True, timeout=30
            )
            text = dump.stdout + dump.stderr
        except (OSError, subprocess.TimeoutExpired) as err:
            text = f"py-spy failed: {err}"
        dumps.append(f"--- pid {proc.name}: {cmdline[:120]}\n{text.strip()}")
    return "\n".join(dumps) or "(no vLLM process running)"


@dataclass(frozen=True)
class Pace:
    """How fast the engines answer on this machine today: the slowest of a few requests of
    the warm-up's longest prompt through the router (prefill, KV pull, 8 tokens of decode).

    Two CPU engines share two cores with the cluster, and their pace varies several-fold
    from one machine or hour to the next; a fixed read timeout that fits one day cuts a
    healthy request on another. Every wait in the tier for an engine's answer is a multiple
    of this figure, never under the fixed floor it replaces."""

    request_s: float

    #: How many idle-machine requests' time a request may take under the tier's own load
    #: (a few clients, a drain, a restarting engine beside it) before it counts as stuck.
    SLACK = 30.0

    def timeout_s(self, floor_s: float = 60.0) -> float:
        return max(floor_s, self.SLACK * self.request_s)


def measure_pace(service: Service, requests: int = 3) -> Pace:
    """`Pace` from `requests` sequential requests through the router of idle engines."""
    prompt = " ".join(str(i) for i in range(max(WARM_UP_WORDS)))
    body = {"model": SERVED_MODEL, "max_tokens": 8, "ignore_eos": True, "prompt": prompt}
    slowest = 0.0
    with httpx.Client(timeout=300) as http:
        for _ in range(requests):
            started = time.monotonic()
            http.post(f"{service.router()}/v1/completions", json=body).raise_for_status()
            slowest = max(slowest, time.monotonic() - started)
    return Pace(slowest)


def _has_ip(service: Service, role: str) -> bool:
    return any(p["status"].get("podIP") for p in service.role_pods(role))


# ----- what the engines record ------------------------------------------------------------------


def sample_sum(text: str, name: str, **match: str) -> float:
    """The sum of a page's samples called ``name`` whose labels include ``match``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in match.items()):
                total += float(sample.value)
    return total


def scrape(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=10).text


def pod_urls(service: Service, role: str) -> dict[str, str]:
    """Ready pods of a role: name -> engine URL."""
    return {
        p["metadata"]["name"]: f"http://{p['status']['podIP']}:8000"
        for p in service.role_pods(role)
        if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")
    }


def wait_engines_idle(urls: Mapping[str, str], timeout_s: float = 60.0) -> None:
    """Until every engine reads no running or waiting request."""

    def idle() -> bool:
        for url in urls.values():
            text = scrape(url)
            busy = sample_sum(text, "vllm:num_requests_running")
            if busy + sample_sum(text, "vllm:num_requests_waiting"):
                return False
        return True

    wait_until(idle, timeout_s, "engines idle", interval_s=0.5)


def wait_serving(service: Service, timeout_s: float = 600.0) -> None:
    """Until every pool is at its StatefulSet's size, Ready and listed by the router (an
    engine a test stopped comes back through the bridge's restart, which takes its start)."""
    counts = {
        role: service.statefulset_replicas(role) or 0
        for role in (labels.ROLE_PREFILL, labels.ROLE_DECODE)
    }
    wait_settled(service, counts, timeout_s)
