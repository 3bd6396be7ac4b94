"""The messages pdfleet's operator and its worker pods exchange about the KV preflight.

Where it fits: the worker (`pdfleet_worker.preflight`) measures a KV transfer between a decode
and a prefill pod and answers with a `PreflightResult`; the operator (`pdfleet.preflight`)
reads that result and turns the measured bandwidth into the time a typical prompt's KV cache
takes with `KVCacheShape`. Both sides import this module and nothing else of each other, so
the operator image carries no worker code. Pure: no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float8": 1}

TransportKind = Literal["rdma", "cuda_ipc", "cuda_copy", "shm", "tcp", "self", "unknown"]


@dataclass(frozen=True)
class KVCacheShape:
    """What one token of KV cache is made of (the model's config.json says it)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    def heads_per_rank(self, tp: int) -> int:
        # vLLM shards KV heads across TP ranks and replicates them when tp > kv_heads.
        return max(1, self.kv_heads // max(1, tp))

    def bytes_per_token(self, tp: int = 1) -> int:
        """2 (K and V) x layers x KV heads x head size x dtype bytes, on one TP rank."""
        return 2 * self.layers * self.heads_per_rank(tp) * self.head_dim * self.dtype_bytes


# What the operator asks a decode pod to measure (POST /preflight/run)


@dataclass(frozen=True)
class PreflightRequest:
    """What the operator asks a decode pod to measure."""

    peer: str  # base URL of the prefill pod's preflight listener
    tokens: int
    block_size: int
    geometry: KVCacheShape
    tp: int = 1
    iterations: int = 5
    memory: str | None = None  # None: the pod's default (default_memory)
    timeout_s: float = 120.0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreflightRequest:
        geometry = data["geometry"]
        return cls(
            peer=str(data["peer"]).rstrip("/"),
            tokens=int(data["tokens"]),
            block_size=int(data.get("blockSize", 16)),
            geometry=KVCacheShape(
                layers=int(geometry["layers"]),
                kv_heads=int(geometry["kvHeads"]),
                head_dim=int(geometry["headDim"]),
                dtype_bytes=int(geometry["dtypeBytes"]),
            ),
            tp=int(data.get("tp", 1)),
            iterations=max(1, int(data.get("iterations", 5))),
            memory=data.get("memory") or None,
            timeout_s=float(data.get("timeoutSeconds", 120.0)),
        )

    def to_json(self) -> dict[str, Any]:
        g = self.geometry
        return {
            "peer": self.peer,
            "tokens": self.tokens,
            "blockSize": self.block_size,
            "geometry": {
                "layers": g.layers,
                "kvHeads": g.kv_heads,
                "headDim": g.head_dim,
                "dtypeBytes": g.dtype_bytes,
            },
            "tp": self.tp,
            "iterations": self.iterations,
            "memory": self.memory,
            "timeoutSeconds": self.timeout_s,
        }


# The result a decode pod reports to the operator


@dataclass(frozen=True)
class PreflightResult:
    """One preflight run between a decode (initiator, READs) and a prefill (target) pod."""

    ok: bool
    error: str = ""
    memory: str = "DRAM"
    transport: str = ""
    transport_kind: TransportKind = "unknown"
    lanes: tuple[str, ...] = ()
    total_bytes: int = 0
    descriptors: int = 0
    descriptor_bytes: int = 0
    iterations: int = 0
    seconds: tuple[float, ...] = ()
    latency_s: float | None = None
    verified: bool = False
    target_agent: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        """Payload bytes over the median time of the timed READs."""
        if not self.seconds or self.total_bytes <= 0:
            return None
        median = statistics.median(self.seconds)
        return self.total_bytes / median if median > 0 else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["lanes"] = list(self.lanes)
        out["seconds"] = list(self.seconds)
        out["extra"] = dict(self.extra)
        out["bandwidth_bytes_per_s"] = self.bandwidth_bytes_per_s
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreflightResult:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["lanes"] = tuple(values.get("lanes") or ())
        values["seconds"] = tuple(float(s) for s in values.get("seconds") or ())
        return cls(**values)


def failed(error: str, **details: Any) -> PreflightResult:
    return PreflightResult(ok=False, error=error, **details)
