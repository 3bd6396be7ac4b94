"""The KV revision of a service: a short hash of everything that decides whether a decode can
use KV a prefill computed.

Where it fits: render labels every worker pod with it and pins the router's selectors to one
revision (pdfleet.render); the rollout plan (rollout/plan.py) compares the spec's revision with
the pods' and the router's. Pure.

What goes in is what changes the KV cache or how it is moved: the model (weights and the
length it is served at), the engine (image, vLLM version, engine and per-role arguments and
environment, which can change the dtype, block size or attention backend: listing the few that
cannot is not worth one wrong guess), the KV connector and its fabric (UCX transports and
devices, RDMA resource, networks), and each role's parallel shape. Replica counts, resources,
scheduling, the router, SLOs, autoscaling and drain settings leave it alone: a change to them
rolls in place.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pdfleet import labels
from pdfleet.api.v1alpha1 import InferenceService

REVISION_CHARS = 10


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


def kv_inputs(isvc: InferenceService) -> dict[str, Any]:
    """The parts of the spec the revision is the hash of (also what `pdfleet render` can
    print to explain why two revisions differ)."""
    spec = isvc.spec
    engine = spec.engine
    kv = spec.kv_transfer
    return {
        "model": _dump(spec.model),
        "engine": {
            "image": engine.image,
            "vllmVersion": engine.vllm_version,
            "extraArgs": list(engine.extra_args),
            "env": [_dump(e) for e in engine.env],
        },
        "kvTransfer": {
            "connector": kv.connector,
            "backends": list(kv.backends),
            "bufferDevice": kv.buffer_device,
            # The transports, devices and networks a pair reads KV over: peers that share
            # none cannot move it.
            "fabric": _dump(kv.fabric) if kv.fabric is not None else None,
        },
        "roles": {
            role: {
                "parallelism": _dump(spec.role(role).parallelism),
                "extraArgs": list(spec.role(role).extra_args),
                "env": [_dump(e) for e in spec.role(role).env],
            }
            for role in labels.WORKER_ROLES
        },
    }


def kv_revision(isvc: InferenceService) -> str:
    canonical = json.dumps(kv_inputs(isvc), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_CHARS]
