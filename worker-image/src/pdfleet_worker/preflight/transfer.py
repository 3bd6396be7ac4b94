"""The preflight's NIXL I/O: a target that offers a registered KV-sized buffer, an initiator
that READs it like a decode engine, and the runner that reads back which UCX transport moved it.

Where it fits: the agent's preflight listener (`server`) keeps one `Target` (the prefill side)
and, for a run (the decode side), calls `run()`, which starts `python -m
pdfleet_worker.preflight.transfer` with UCX's protocol report on (UCX_PROTO_INFO=y): a fresh
process gets a fresh UCX context, so the report shows the protocols chosen for this run, and
a crash in native code cannot take the listener down. Host memory (numpy) always works; VRAM
needs torch with CUDA, as in the vLLM image. Layout, transport parsing and the result record
are pure (`plan`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt

import pdfleet_wire.preflight as wire
from pdfleet_worker.preflight import plan

_CHUNK = 1 << 20  # the fill pattern repeats per MiB, each MiB stamped with its index
_NIXL_MODULES = ("nixl._api", "nixl_cu13._api", "nixl_cu12._api")
_POLL_S = 0.0005
# The initiator's own deadline covers its transfers; this much more for it to start (import
# NIXL, create the UCX context) and clean up.
CHILD_START_S = 30.0


def nixl_api() -> ModuleType:
    """NIXL's Python API: the `nixl` meta package (vLLM images) or a backend wheel directly."""
    import importlib

    errors = []
    for name in _NIXL_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as err:
            errors.append(f"{name}: {err}")
    raise ImportError("NIXL is not installed (" + "; ".join(errors) + ")")


# --------------------------------------------------------------------------------------------
# Buffers: a deterministic pattern, in host memory or on the GPU


def _expected_chunk(base: npt.NDArray[np.uint8], index: int, length: int) -> npt.NDArray[np.uint8]:
    chunk = base[:length].copy()
    stamp = np.array([index], dtype="<u8").view(np.uint8)
    chunk[: min(8, length)] = stamp[: min(8, length)]
    return chunk


def _base(seed: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(seed).integers(0, 256, _CHUNK, dtype=np.uint8)


def fill(buf: npt.NDArray[np.uint8], seed: int) -> None:
    """Write the pattern of `seed`: a random MiB, repeated, each copy stamped with its index
    (so a transfer that moves the right bytes to the wrong place does not verify)."""
    base = _base(seed)
    for index, start in enumerate(range(0, buf.size, _CHUNK)):
        length = min(_CHUNK, buf.size - start)
        buf[start : start + length] = _expected_chunk(base, index, length)


def verify(buf: npt.NDArray[np.uint8], seed: int) -> bool:
    base = _base(seed)
    for index, start in enumerate(range(0, buf.size, _CHUNK)):
        length = min(_CHUNK, buf.size - start)
        if not np.array_equal(buf[start : start + length], _expected_chunk(base, index, length)):
            return False
    return True


@dataclass
class Buffer:
    """A contiguous buffer NIXL can register: host memory, or a CUDA tensor (VRAM)."""

    memory: str  # "DRAM" | "VRAM"
    addr: int
    nbytes: int
    device: int
    host: npt.NDArray[np.uint8] | None = None
    tensor: Any = None  # torch.Tensor on the GPU

    @classmethod
    def allocate(cls, memory: str, nbytes: int, device: int = 0) -> Buffer:
        if memory == "VRAM":
            torch = _torch()
            tensor = torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
            return cls("VRAM", int(tensor.data_ptr()), nbytes, device, tensor=tensor)
        host = np.zeros(nbytes, dtype=np.uint8)
        return cls("DRAM", int(host.ctypes.data), nbytes, 0, host=host)

    def fill(self, seed: int) -> None:
        if self.host is not None:
            fill(self.host, seed)
            return
        staged = np.empty(self.nbytes, dtype=np.uint8)
        fill(staged, seed)
        self.tensor.copy_(_torch().from_numpy(staged))
        _torch().cuda.synchronize(self.device)

    def verify(self, seed: int) -> bool:
        if self.host is not None:
            return verify(self.host, seed)
        return verify(self.tensor.cpu().numpy(), seed)

    def descs(self, layout: plan.Layout) -> npt.NDArray[np.int64]:
        """(address, length, device) rows, one per descriptor, as NIXL takes them."""
        return descs(self.addr, layout, self.device)


def descs(addr: int, layout: plan.Layout, device: int) -> npt.NDArray[np.int64]:
    rows = np.empty((layout.descriptors, 3), dtype=np.int64)
    rows[:, 0] = addr + np.arange(layout.descriptors, dtype=np.int64) * layout.descriptor_bytes
    rows[:, 1] = layout.descriptor_bytes
    rows[:, 2] = device
    return rows


def _torch() -> Any:
    import torch  # only in the GPU image (vLLM ships it); host-memory runs never import it

    return torch


def default_memory(env: Mapping[str, str]) -> str:
    """VRAM where vLLM keeps its KV cache on the GPU; the simulator and a `cpu` KV buffer
    device use host memory."""
    if env.get("PDFLEET_ENGINE", "vllm") == "sim":
        return "DRAM"
    if env.get("PDFLEET_KV_BUFFER_DEVICE", "cuda").strip() == "cpu":
        return "DRAM"
    return "VRAM"


def agent_config(api: ModuleType, backends: Sequence[str]) -> Any:
    return api.nixl_agent_config(
        enable_prog_thread=True, enable_listen_thread=False, backends=list(backends)
    )


# --------------------------------------------------------------------------------------------
# The target (prefill side): lives in the listener, one offer per run


@dataclass
class Offer:
    buffer: Buffer
    handle: Any
    expires: float


class Target:
    """Offers pattern-filled, registered buffers for initiators to READ; thread-safe."""

    def __init__(self, name: str, backends: Sequence[str], env: Mapping[str, str]) -> None:
        self.name = name
        self.backends = tuple(backends)
        self.env = dict(env)
        self._agent: Any = None
        self._offers: dict[str, Offer] = {}
        self._lock = threading.Lock()

    def _nixl(self) -> Any:
        if self._agent is None:
            api = nixl_api()
            self._agent = api.nixl_agent(self.name, agent_config(api, self.backends))
        return self._agent

    def offer(self, nbytes: int, seed: int, memory: str | None, ttl_s: float) -> dict[str, Any]:
        memory = memory or default_memory(self.env)
        with self._lock:
            self._expire(time.monotonic())
            agent = self._nixl()
            buffer = Buffer.allocate(memory, nbytes)
            buffer.fill(seed)
            handle = agent.register_memory(
                [(buffer.addr, buffer.nbytes, buffer.device, "")], memory
            )
            offer_id = uuid.uuid4().hex
            self._offers[offer_id] = Offer(buffer, handle, time.monotonic() + ttl_s)
            metadata = agent.get_agent_metadata()
        return {
            "id": offer_id,
            "agent": self.name,
            "metadata": base64.b64encode(metadata).decode(),
            "addr": buffer.addr,
            "bytes": buffer.nbytes,
            "device": buffer.device,
            "memory": memory,
            "sideChannel": side_channel(self.env),
        }

    def release(self, offer_id: str) -> bool:
        with self._lock:
            offer = self._offers.pop(offer_id, None)
            if offer is not None:
                self._agent.deregister_memory(offer.handle)
                self._drop_idle_agent()
            return offer is not None

    def _expire(self, now: float) -> None:
        """Offers whose initiator never released them (it died) are dropped after their TTL."""
        for offer_id in [k for k, o in self._offers.items() if o.expires < now]:
            self._agent.deregister_memory(self._offers.pop(offer_id).handle)
        self._drop_idle_agent()

    def _drop_idle_agent(self) -> None:
        """Destroy the agent once nothing is offered: NIXL's progress thread polls without a
        pause (pthrDelay 0), a busy core beside the engine for as long as the agent lives."""
        if not self._offers:
            self._agent = None


def side_channel(env: Mapping[str, str]) -> str:
    """host:port the engine's NIXL side channel listens on (what a decode engine dials)."""
    host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or env.get("PDFLEET_POD_IP") or ""
    port = env.get("VLLM_NIXL_SIDE_CHANNEL_PORT") or env.get("PDFLEET_SIDE_CHANNEL_PORT") or ""
    return f"{host}:{port}" if host and port else ""


# --------------------------------------------------------------------------------------------
# The initiator (decode side): runs in its own process


class TransferError(RuntimeError):
    pass


def _wait(agent: Any, handle: Any, deadline: float) -> None:
    state = agent.transfer(handle)
    while state == "PROC":
        if time.monotonic() > deadline:
            raise TransferError("READ did not complete before the deadline")
        time.sleep(_POLL_S)
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise TransferError(f"READ ended in state {state}")


def _timed(agent: Any, handle: Any, deadline: float, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        _wait(agent, handle, deadline)
        times.append(time.perf_counter() - started)
    return times


def _side_channel_reachable(address: str, timeout_s: float = 5.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def initiate(request: wire.PreflightRequest, env: Mapping[str, str]) -> wire.PreflightResult:
    """READ the peer's offer like a decode engine pulls KV: warm-up, timed READs of the whole
    payload, a one-descriptor latency probe, then a byte-for-byte check."""
    layout = plan.layout(request.geometry, request.tokens, request.block_size, request.tp)
    memory = request.memory or default_memory(env)
    seed = int.from_bytes(os.urandom(4), "little")
    deadline = time.monotonic() + request.timeout_s
    base = dict(
        memory=memory,
        total_bytes=layout.total_bytes,
        descriptors=layout.descriptors,
        descriptor_bytes=layout.descriptor_bytes,
    )
    with httpx.Client(timeout=httpx.Timeout(request.timeout_s, connect=10.0)) as http:
        try:
            response = http.post(
                f"{request.peer}/preflight/offer",
                json={"bytes": layout.total_bytes, "seed": seed, "memory": memory},
            )
            response.raise_for_status()
        except httpx.HTTPError as err:
            return wire.failed(f"prefill preflight listener {request.peer}: {err}", **base)
        offer = response.json()
        try:
            result = _read(request, env, offer, layout, memory, seed, deadline)
        except Exception as err:  # native errors surface as RuntimeError/nixlError
            result = wire.failed(f"{type(err).__name__}: {err}", **base)
        finally:
            with contextlib.suppress(httpx.HTTPError):  # the offer expires on its own
                http.post(f"{request.peer}/preflight/release", json={"id": offer["id"]})
    channel = str(offer.get("sideChannel") or "")
    reachable = bool(channel) and _side_channel_reachable(channel)
    extra = {**result.extra, "sideChannel": channel, "sideChannelReachable": reachable}
    return replace(result, extra=extra)


def _read(
    request: wire.PreflightRequest,
    env: Mapping[str, str],
    offer: Mapping[str, Any],
    layout: plan.Layout,
    memory: str,
    seed: int,
    deadline: float,
) -> wire.PreflightResult:
    api = nixl_api()
    backends = [b for b in env.get("PDFLEET_KV_BACKENDS", "UCX").split(",") if b] or ["UCX"]
    name = f"pdfleet-preflight-{socket.gethostname()}-{os.getpid()}"
    agent = api.nixl_agent(name, agent_config(api, backends))
    local = Buffer.allocate(memory, layout.total_bytes)
    registered = agent.register_memory([(local.addr, local.nbytes, local.device, "")], memory)
    remote_name = agent.add_remote_agent(base64.b64decode(offer["metadata"]))
    handles = []
    try:
        local_descs = agent.get_xfer_descs(local.descs(layout), memory)
        remote_rows = descs(int(offer["addr"]), layout, int(offer["device"]))
        remote_descs = agent.get_xfer_descs(remote_rows, str(offer["memory"]))
        whole = agent.initialize_xfer("READ", local_descs, remote_descs, remote_name)
        handles.append(whole)
        _wait(agent, whole, deadline)  # warm-up: connection set-up, registration caches
        seconds = _timed(agent, whole, deadline, request.iterations)
        verified = local.verify(seed)
        one = plan.Layout(1, layout.descriptor_bytes)
        probe = agent.initialize_xfer(
            "READ",
            agent.get_xfer_descs(local.descs(one), memory),
            agent.get_xfer_descs(
                descs(int(offer["addr"]), one, int(offer["device"])), str(offer["memory"])
            ),
            remote_name,
        )
        handles.append(probe)
        latency = statistics.median(_timed(agent, probe, deadline, 20))
    finally:
        for handle in handles:
            agent.release_xfer_handle(handle)
        agent.remove_remote_agent(remote_name)
        agent.deregister_memory(registered)
    return wire.PreflightResult(
        ok=verified,
        error="" if verified else "the data read does not match what the prefill side wrote",
        memory=memory,
        total_bytes=layout.total_bytes,
        descriptors=layout.descriptors,
        descriptor_bytes=layout.descriptor_bytes,
        iterations=request.iterations,
        seconds=tuple(seconds),
        latency_s=latency,
        verified=verified,
        target_agent=str(offer.get("agent", "")),
    )


# --------------------------------------------------------------------------------------------
# The runner: one initiator process per run, its UCX protocol report parsed


def run(request: wire.PreflightRequest, env: Mapping[str, str]) -> wire.PreflightResult:
    """Run the initiator in a child process with UCX_PROTO_INFO=y and attach the transport
    UCX reported for the remote reads of one descriptor. The result comes back through a
    file: UCX's report shares stdout, where C stdio may split lines across our output."""
    child_env = {**env, "UCX_PROTO_INFO": "y"}
    with tempfile.TemporaryDirectory(prefix="pdfleet-preflight-") as tmp:
        out = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "pdfleet_worker.preflight.transfer", "initiate", str(out)]
        try:
            done = subprocess.run(
                argv,
                input=json.dumps(request.to_json()),
                env=child_env,
                capture_output=True,
                text=True,
                timeout=request.timeout_s + CHILD_START_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            limit = request.timeout_s + CHILD_START_S
            return wire.failed(f"the initiator did not finish in {limit:.0f} s")
        output = done.stdout + done.stderr
        if not out.exists():
            tail = " | ".join(output.strip().splitlines()[-5:])
            return wire.failed(f"the initiator exited with {done.returncode}: {tail}"[:1000])
        result = wire.PreflightResult.from_json(json.loads(out.read_text()))
    lanes = plan.read_lanes(output, result.descriptor_bytes)
    return replace(
        result,
        lanes=tuple(lanes),
        transport=plan.describe(lanes),
        transport_kind=plan.best_kind(lanes),
    )


_names = itertools.count()


def target_name(env: Mapping[str, str]) -> str:
    pod = env.get("POD_NAME") or socket.gethostname()
    return f"pdfleet-preflight-target-{pod}-{os.getpid()}-{next(_names)}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pdfleet_worker.preflight.transfer")
    parser.add_argument("mode", choices=["initiate"], help="READ from the peer in stdin's JSON")
    parser.add_argument("out", type=Path, help="where to write the result (JSON)")
    args = parser.parse_args(argv)
    request = wire.PreflightRequest.from_json(json.loads(sys.stdin.read()))
    result = initiate(request, os.environ)
    args.out.write_text(json.dumps(result.to_json()))


if __name__ == "__main__":
    main()
