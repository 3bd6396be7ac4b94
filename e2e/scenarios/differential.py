"""Hold pdfleet-sim to real vLLM: the same requests to a simulated and a real P/D pair, and
what the operator and the router can observe of each, compared.

Where it fits: the real-engine tier (tests/e2e/engine/test_sim_matches_engine.py) runs
:func:`observe` against a real prefill/decode pair of the cluster and against a simulator
pair started from the same pod environment, then :func:`differences` lists every mismatch
that is not named in :data:`ON_PURPOSE`. The simulator's page (docs/simulator.md) claims
nothing this comparison does not back.

Compared: the metric families of both roles (names, types, label names, histogram buckets),
the prefill's ``kv_transfer_params`` (keys and JSON types), the shape of the answers
(response, choice and usage keys), what a decode does with good, partial and stale KV
parameters (status, and whether it loaded or computed the prompt), a request with
``stream_options`` but no stream, ``/v1/models`` and ``/health``; and, with
:func:`drain_answers`, what a decode answers once SIGTERM arrives with a stream in flight.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from e2e.platform import bridge
from e2e.platform.cluster import wait_until
from e2e.platform.real_engine import sample_sum

#: vLLM 0.33 differs from the CPU build the tier runs (0.32) here; the simulator follows
#: 0.33 (reference: vLLM 0.33's nixl connector metadata).
V033_ONLY_KV_KEYS = frozenset({"remote_registration_generation"})

#: Families the simulator leaves out on purpose, by prefix, and why.
ON_PURPOSE: dict[str, str] = {
    "http_": "the instrumentator of vLLM's FastAPI app; nothing in pdfleet reads HTTP-layer "
    "metrics, and the simulator's web framework is not vLLM's",
    "python_": "the Python runtime's own collectors; not vLLM's, read by nothing in pdfleet",
    "process_": "the process collector; not vLLM's, read by nothing in pdfleet",
}

#: Families compared by name and type only, and why.
LABELS_NOT_COMPARED: dict[str, str] = {
    "vllm:cache_config_info": "an info gauge whose labels are the engine's CacheConfig fields, "
    "renamed and added every release; pdfleet reads none of them",
}

#: What vLLM's API server answers to a request that arrives while it shuts down.
SHUTDOWN = "cannot schedule new futures after shutdown"

#: Where vLLM says a request's prompt tokens came from.
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")

#: A request the decode must load from the prefill, small enough for any engine.
PROMPT = "the prefill computes and the decode loads 0.5 cache block token request model"


@dataclass(frozen=True)
class Family:
    """One metric family as a scraper sees it (counters by their wire name, `_total`)."""

    type: str
    label_names: frozenset[str]
    buckets: tuple[float, ...] = ()


def families(text: str) -> dict[str, Family]:
    out: dict[str, Family] = {}
    for family in text_string_to_metric_families(text):
        names: set[str] = set()
        buckets: set[float] = set()
        for sample in family.samples:
            names |= set(sample.labels) - {"le", "quantile"}
            if sample.name.endswith("_bucket") and "le" in sample.labels:
                buckets.add(float(sample.labels["le"]))
        name = family.name + "_total" if family.type == "counter" else family.name
        out[name] = Family(family.type, frozenset(names), tuple(sorted(buckets - {math.inf})))
    return out


def json_shape(value: Any) -> Any:
    """Keys and JSON types, recursively (lists by their first element)."""
    if isinstance(value, dict):
        return {k: json_shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [json_shape(value[0])] if value else []
    if value is None:
        return "null"
    return {bool: "bool", int: "number", float: "number", str: "string"}[type(value)]


@dataclass
class Observation:
    """What one P/D pair showed for the probe requests."""

    families: dict[str, dict[str, Family]] = field(default_factory=dict)  # role -> name -> fam
    kv_params: Any = None
    completion: Any = None  # json_shape of a decode's completion answer
    chat: Any = None
    decode_cases: dict[str, tuple[int, str]] = field(default_factory=dict)
    models: Any = None
    health: dict[str, int] = field(default_factory=dict)


def to_json(obs: Observation) -> dict[str, Any]:
    """A JSON form of an observation (a recorded engine run to compare against offline)."""
    return {
        **{k: getattr(obs, k) for k in ("kv_params", "completion", "chat", "models", "health")},
        "decode_cases": {k: list(v) for k, v in obs.decode_cases.items()},
        "families": {
            role: {
                name: {"type": f.type, "labels": sorted(f.label_names), "buckets": list(f.buckets)}
                for name, f in fams.items()
            }
            for role, fams in obs.families.items()
        },
    }


def from_json(data: Mapping[str, Any]) -> Observation:
    return Observation(
        families={
            role: {
                name: Family(f["type"], frozenset(f["labels"]), tuple(f["buckets"]))
                for name, f in fams.items()
            }
            for role, fams in data["families"].items()
        },
        kv_params=data["kv_params"],
        completion=data["completion"],
        chat=data["chat"],
        decode_cases={k: (int(v[0]), str(v[1])) for k, v in data["decode_cases"].items()},
        models=data["models"],
        health=dict(data["health"]),
    )


def _by_source(client: httpx.Client, url: str) -> dict[str, float]:
    text = client.get(f"{url}/metrics").text
    return {source: sample_sum(text, BY_SOURCE, source=source) for source in SOURCES}


def _prefill(client: httpx.Client, prefill: str, model: str) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }
    resp = client.post(f"{prefill}/v1/completions", json=body)
    resp.raise_for_status()
    params: dict[str, Any] = resp.json()["kv_transfer_params"]
    return params


def _decode(
    client: httpx.Client, decode: str, model: str, params: Mapping[str, Any]
) -> tuple[int, str, Any]:
    """(status, where the prompt came from, the answer's shape) of one decode request."""
    before = _by_source(client, decode)
    body = {"model": model, "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True,
            "kv_transfer_params": dict(params)}  # fmt: skip
    resp = client.post(f"{decode}/v1/completions", json=body)
    after = _by_source(client, decode)
    moved = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    source = max(moved, key=lambda k: moved[k]) if any(moved.values()) else "none"
    shape = json_shape(resp.json()) if resp.status_code == 200 else None
    return resp.status_code, source, shape


def observe(prefill: str, decode: str, model: str, timeout_s: float = 60.0) -> Observation:
    """Send the probe requests to one pair (engine URLs) and record what shows; a request
    that takes longer than `timeout_s` fails the observation."""
    obs = Observation()
    with httpx.Client(timeout=timeout_s) as client:
        params = _prefill(client, prefill, model)
        obs.kv_params = json_shape(params)
        status, source, obs.completion = _decode(client, decode, model, params)
        obs.decode_cases["valid"] = (status, source)
        partial = {k: v for k, v in _prefill(client, prefill, model).items() if k != "tp_size"}
        obs.decode_cases["without tp_size"] = _decode(client, decode, model, partial)[:2]
        stale = {**_prefill(client, prefill, model), "remote_request_id": "cmpl-stale-0-00000000"}
        obs.decode_cases["stale request id"] = _decode(client, decode, model, stale)[:2]
        chat = client.post(
            f"{decode}/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": PROMPT}],
                  "max_tokens": 4, "ignore_eos": True},
        )  # fmt: skip
        obs.chat = json_shape(chat.json())
        refused = client.post(
            f"{decode}/v1/completions",
            json={"model": model, "prompt": PROMPT, "max_tokens": 2,
                  "stream_options": {"include_usage": True}},
        )  # fmt: skip
        obs.decode_cases["stream_options without stream"] = (refused.status_code, "none")
        obs.models = json_shape(client.get(f"{decode}/v1/models").json())
        for role, url in (("prefill", prefill), ("decode", decode)):
            obs.health[role] = client.get(f"{url}/health").status_code
            obs.families[role] = families(client.get(f"{url}/metrics").text)
    return obs


def _on_purpose(name: str) -> bool:
    return any(name.startswith(prefix) for prefix in ON_PURPOSE)


def family_differences(sim: Mapping[str, Family], real: Mapping[str, Family]) -> list[str]:
    out = []
    for name in sorted(set(sim) | set(real)):
        if _on_purpose(name) or (
            name.endswith("_created") and _on_purpose(name[: -len("_created")])
        ):
            continue
        if name not in sim:
            out.append(f"{name}: missing in the simulator")
        elif name not in real:
            out.append(f"{name}: the simulator serves it, vLLM does not")
        elif name in LABELS_NOT_COMPARED and sim[name].type == real[name].type:
            continue
        elif sim[name] != real[name]:
            out.append(f"{name}: simulator {sim[name]} != vLLM {real[name]}")
    return out


def differences(sim: Observation, real: Observation) -> list[str]:
    """Every mismatch between the simulator's observation and the engine's, except those
    named on purpose (families in ON_PURPOSE; kv keys only 0.33 has)."""
    out: list[str] = []
    for role in ("prefill", "decode"):
        out += [f"{role} {d}" for d in family_differences(sim.families[role], real.families[role])]
    sim_kv = {k: v for k, v in sim.kv_params.items() if k not in V033_ONLY_KV_KEYS}
    real_kv = {k: v for k, v in real.kv_params.items() if k not in V033_ONLY_KV_KEYS}
    if sim_kv != real_kv:
        out.append(f"kv_transfer_params: simulator {sim.kv_params} != vLLM {real.kv_params}")
    missing_033 = V033_ONLY_KV_KEYS - set(sim.kv_params)
    if missing_033:
        out.append(f"kv_transfer_params: the simulator lacks 0.33's {sorted(missing_033)}")
    for what in ("completion", "chat", "models"):
        if getattr(sim, what) != getattr(real, what):
            out.append(f"{what}: simulator {getattr(sim, what)} != vLLM {getattr(real, what)}")
    for case, got in real.decode_cases.items():
        if sim.decode_cases.get(case) != got:
            out.append(f"decode, {case}: simulator {sim.decode_cases.get(case)} != vLLM {got}")
    if sim.health != real.health:
        out.append(f"/health: simulator {sim.health} != vLLM {real.health}")
    return out


# ----- a simulator pair started as the bridge starts simulated pods ------------------------------


@dataclass(frozen=True)
class SimPair:
    prefill: str  # engine URLs
    decode: str
    decode_process: subprocess.Popen[bytes]


@contextlib.contextmanager
def sim_pair(
    prefill_pod: Mapping[str, Any],
    decode_pod: Mapping[str, Any],
    workdir: Path,
    ips: tuple[str, str] = ("127.0.80.1", "127.0.80.2"),
) -> Iterator[SimPair]:
    """Simulators run from two real pods' own containers and env (as the bridge runs sim
    pods), bound to loopback ``ips``; stopped on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for pod, ip in ((prefill_pod, ips[0]), (decode_pod, ips[1])):
            container = pod["spec"]["containers"][0]
            pod_dir = workdir / pod["metadata"]["name"]
            pod_dir.mkdir(parents=True, exist_ok=True)
            ctx = bridge.LaunchContext(
                pod_ip=ip,
                pod_dir=pod_dir,
                bin_dir=bridge.VENV_BIN,
                kubeconfig=pod_dir / "no-kubeconfig",
                search_path=os.environ.get("PATH", os.defpath),
            )
            env = bridge.resolve_env(container, pod, ip, ip)
            command = bridge.worker_command(container, env, ctx)
            with (pod_dir / "sim.log").open("ab") as log:
                procs.append(
                    subprocess.Popen(
                        bridge.which(command.argv, command.env),
                        env=dict(command.env),
                        cwd=pod_dir,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            urls.append(f"http://{ip}:{env.get('PDFLEET_PORT', '8000')}")
        wait_until(lambda: all(_healthy(url) for url in urls), 60, f"simulators {urls} healthy")
        yield SimPair(urls[0], urls[1], procs[1])
    finally:
        # No graceful stop: a simulator prefill would hold unread KV for its lease.
        for proc in procs:
            proc.kill()
            proc.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# ----- what a draining engine answers -----------------------------------------------------------


def drain_answers(
    url: str, model: str, terminate: Callable[[], None], timeout_s: float = 60.0
) -> dict[str, Any]:
    """What an engine answers once it is told to stop while a request is in flight:
    ``terminate()`` sends the SIGTERM after a long stream started; then a new request,
    ``/health`` and ``/metrics`` are tried, and the stream is read to its end. `timeout_s`
    bounds the wait for any one answer."""
    # About STREAM_S of this engine's own pace: in flight while the probes run, and done
    # well within its 30 s --shutdown-timeout, however slow the machine is today.
    tokens = stream_tokens(url, model, timeout_s)
    for _ in range(STREAM_TRIES):
        stream = InFlight(url, model, tokens, timeout_s)
        try:
            wait_until(stream.seen, timeout_s, f"a request running on {url}", interval_s=0.05)
        except TimeoutError as err:
            raise AssertionError(f"{err}; engine's /metrics: {_queue_counts(url)}") from err
        if not stream.ended:
            break
        # Done before it was seen running: the probe's round trips made the engine look
        # slower than it streams. Nothing is stopped yet, so a longer stream is tried.
        assert stream.outcome.get("status") == 200, f"the stream to {url}: {stream.outcome}"
        tokens = min(4 * tokens, MAX_STREAM_TOKENS)
    else:
        raise AssertionError(f"no stream to {url} stayed in flight: {stream.outcome}")
    terminate()
    time.sleep(0.5)  # the signal handler runs before the next request is read
    answers: dict[str, Any] = {}
    with httpx.Client(timeout=timeout_s / 2) as http:
        # While the stream is surely in flight: the engine's drain waits for it.
        for path in ("/health", "/metrics"):
            answers[path] = _status(http, "GET", f"{url}{path}")
        new = {"model": model, "prompt": PROMPT, "max_tokens": 2}
        answers["new request"] = _status(http, "POST", f"{url}/v1/completions", new)
    streamed = stream.result(2 * timeout_s)
    answers["in-flight stream"] = (streamed.get("status"), streamed.get("done"))
    answers["in-flight tokens complete"] = streamed.get("tokens") == tokens
    return answers


class InFlight:
    """One streamed completion of `tokens` tokens, read to its end on a thread."""

    def __init__(self, url: str, model: str, tokens: int, timeout_s: float) -> None:
        self.body = {"model": model, "prompt": PROMPT, "max_tokens": tokens,
                     "ignore_eos": True, "stream": True,
                     "stream_options": {"include_usage": True}}  # fmt: skip
        self.url, self.timeout_s = url, timeout_s
        self.outcome: dict[str, Any] = {}
        self._streaming = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def ended(self) -> bool:
        return "status" in self.outcome

    def seen(self) -> bool:
        """Running on the engine (its first token came back), or already over. The token,
        not the engine's running gauge: on a loaded machine a poll of /metrics can take
        longer than a whole stream, so a stream may end before any poll saw it."""
        return self.ended or self._streaming.is_set()

    def result(self, wait_s: float) -> dict[str, Any]:
        self._reader.join(wait_s)
        return self.outcome

    def _read(self) -> None:
        try:
            with (
                httpx.Client(timeout=2 * self.timeout_s) as http,
                http.stream("POST", f"{self.url}/v1/completions", json=self.body) as resp,
            ):
                lines = []
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        self._streaming.set()
        except httpx.HTTPError as err:
            self.outcome["status"] = f"cut: {type(err).__name__}"
            return
        usage = [json.loads(x[6:]).get("usage") for x in lines[:-1]]
        self.outcome["done"] = bool(lines) and lines[-1] == "data: [DONE]"
        self.outcome["tokens"] = next((u["completion_tokens"] for u in reversed(usage) if u), 0)
        self.outcome["status"] = resp.status_code  # last: `ended` reads it


STREAM_S = 8.0
#: Tries at a stream still in flight when the drain starts, each 4x longer than the last.
STREAM_TRIES = 3
#: The longest stream tried: PROMPT and it fit the tier's 2,048-token context.
MAX_STREAM_TOKENS = 1800


def stream_tokens(
    url: str, model: str, timeout_s: float, probe_tokens: tuple[int, int] = (8, 40)
) -> int:
    """How many tokens the engine at `url` makes in about STREAM_S, within [16, 600]: the
    rate of the extra tokens of the longer of two short requests, so the prefill and the
    round trips both pay (on a loaded machine most of a fast engine's short request) do
    not make the engine look slower than it streams."""
    took = []
    for tokens in probe_tokens:
        body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True}
        started = time.monotonic()
        httpx.post(f"{url}/v1/completions", json=body, timeout=timeout_s).raise_for_status()
        took.append(time.monotonic() - started)
    short, long = probe_tokens
    # The longer request alone errs short; the difference is nearer, unless a hiccup in the
    # first request ate it, so it may raise the estimate at most threefold (a slow engine
    # streaming 3x its estimate still ends within its --shutdown-timeout).
    alone = long / took[1]
    rate = min(3 * alone, max(alone, (long - short) / max(took[1] - took[0], 1e-3)))
    return max(16, min(600, int(rate * STREAM_S)))


def _status(
    http: httpx.Client, method: str, url: str, body: Mapping[str, Any] | None = None
) -> str:
    """`<status>` (and whether the body says vLLM's shutdown words), or why none came."""
    try:
        resp = http.request(method, url, json=body)
    except httpx.HTTPError as err:
        return f"no answer: {type(err).__name__}"
    said = f" {SHUTDOWN}" if SHUTDOWN in resp.text else ""
    return f"{resp.status_code}{said}"


def _queue_counts(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {
        name: sample_sum(text, f"vllm:{name}")
        for name in ("num_requests_running", "num_requests_waiting", "request_success_total")
    }
