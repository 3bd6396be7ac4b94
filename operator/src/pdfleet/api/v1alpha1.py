"""The InferenceService API, pdfleet.dev/v1alpha1: the single source of truth for the CRD.

The pydantic models below are what users write (spec) and what the operator reports (status).
`pdfleet.api.crd` turns them into `crds/pdfleet.dev_inferenceservices.yaml`; every field's
description becomes `kubectl explain` text, so describe fields for the people who apply them.
Cross-field rules are `Rule`s: CEL on the API server, the same check in Python here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_snake

from pdfleet import labels
from pdfleet.api.owned import ENV_NAME_RULE, EXTRA_ARG_RULE
from pdfleet.api.rules import ApiModel, Checked, Rule
from pdfleet.api.types import (
    DNSLabel,
    Duration,
    FreeFormObject,
    PortNumber,
    Quantity,
    ResourceName,
    duration_between,
    parse_duration,
)

# The taint GPU nodes usually carry (NVIDIA GPU operator, cloud GPU node pools).
GPU_TOLERATION: dict[str, Any] = {
    "key": "nvidia.com/gpu",
    "operator": "Exists",
    "effect": "NoSchedule",
}

# Children such as the router's Service are named "<name>-<role>", and a Service name is an
# RFC 1035 label; the API server itself only checks the looser DNS subdomain form.
SERVICE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# Defaults for sub-objects are written as {} in the CRD so the API server fills their fields.
EMPTY_OBJECT: dict[str, Any] = {"default": {}}

# Data-parallel ranks of one pod at most; rank r's NIXL side channel listens on base + r, so a
# pod may listen on up to this many ports from kvTransfer.sideChannelPort on.
MAX_DATA_PARALLEL = 64

ExtraArg = Annotated[str, Field(max_length=4096), Checked((EXTRA_ARG_RULE,))]
"""One `vllm serve` argument; flags the operator sets are refused (pdfleet.api.owned)."""

# ---------------------------------------------------------------------------------------------
# Model and engine


class SecretKeyRef(ApiModel):
    """A key of a Secret in the InferenceService's namespace."""

    name: DNSLabel = Field(description="Name of the Secret.")
    key: str = Field(
        "token", min_length=1, max_length=253, description="Key inside the Secret's data."
    )


class PVCSource(ApiModel):
    """Model weights already on a PersistentVolumeClaim, mounted read-only into every worker."""

    claim_name: DNSLabel = Field(description="Name of the PersistentVolumeClaim.")
    path: str = Field(
        "/",
        pattern=r"^/",
        max_length=1024,
        description="Absolute path of the model directory inside the volume.",
    )


class HubSource(ApiModel):
    """Model weights downloaded by the workers from a model hub at start-up."""

    id: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Hub repository id; defaults to spec.model.name.",
    )
    revision: str | None = Field(
        None, min_length=1, max_length=256, description="Branch, tag or commit to download."
    )
    token_secret_ref: SecretKeyRef | None = Field(
        None,
        description="Secret holding the hub token (exposed to workers as HF_TOKEN). Only the "
        "reference is stored; pdfleet never reads or logs the value.",
    )


class ModelSource(ApiModel):
    """Where the workers load the model from: exactly one of pvc or hub."""

    __rules__ = (
        Rule(
            cel="has(self.pvc) != has(self.hub)",
            message="set exactly one of pvc or hub",
            check=lambda s: (s.pvc is None) != (s.hub is None),
        ),
    )

    pvc: PVCSource | None = Field(None, description="Load from a PersistentVolumeClaim.")
    hub: HubSource | None = Field(None, description="Download from a model hub.")


class ModelSpec(ApiModel):
    """The model served by both pools."""

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Model name clients send in the OpenAI `model` field (and the hub id "
        "unless source.hub.id says otherwise), e.g. meta-llama/Llama-3.1-8B-Instruct.",
    )
    source: ModelSource | None = Field(
        None, description="Where the weights come from; defaults to the hub, anonymously."
    )
    max_model_len: int | None = Field(
        None, ge=16, le=10_000_000, description="Maximum context length (vLLM --max-model-len)."
    )


class EnvVar(ApiModel):
    """An environment variable for the worker container (the core/v1 EnvVar form)."""

    name: Annotated[str, Checked((ENV_NAME_RULE,))] = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description="Variable name. Names the operator sets and depends on are refused "
        "(docs/worker.md); HF_HOME and HF_TOKEN replace the operator's values.",
    )
    value: str | None = Field(None, description="Literal value.")
    value_from: FreeFormObject | None = Field(
        None, description="Source of the value (core/v1 EnvVarSource), e.g. a secretKeyRef."
    )


class EngineSpec(ApiModel):
    """The vLLM engine the workers run."""

    image: str = Field(
        min_length=1,
        max_length=512,
        description="Worker container image: vLLM with NIXL and the pdfleet agent "
        "(see worker-image/).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of the worker image."
    )
    vllm_version: str = Field(
        "0.33",
        pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$",
        description="vLLM version inside the image; selects version-dependent flags and ports.",
    )
    port: PortNumber = Field(8000, description="Port of vLLM's OpenAI-compatible server.")
    extra_args: list[ExtraArg] = Field(
        default_factory=list,
        max_length=64,
        description="Extra `vllm serve` arguments for both roles, appended last. Flags the "
        "operator sets from the spec (--port, --tensor-parallel-size, --kv-transfer-config, "
        "...) are refused: set their fields instead.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment for both roles; a role's env replaces an entry of the "
        "same name.",
    )


# ---------------------------------------------------------------------------------------------
# KV transfer and the RDMA fabric


class UCXSpec(ApiModel):
    """UCX settings for NIXL's UCX backend (become UCX_* environment variables)."""

    tls: str | None = Field(
        None,
        max_length=256,
        pattern=r"^[a-z0-9_,^]+$",
        description="UCX_TLS: transports in order of preference, e.g. rc_x,rc,dc_x,cuda_copy,"
        "cuda_ipc. Leave unset to let UCX choose.",
    )
    net_devices: str | None = Field(
        None,
        max_length=256,
        pattern=r"^[A-Za-z0-9_.:,-]+$",
        description="UCX_NET_DEVICES: the HCA ports to use, e.g. mlx5_0:1,mlx5_1:1.",
    )
    gid_index: int | None = Field(
        None, ge=0, le=255, description="UCX_IB_GID_INDEX: the RoCE GID index (often 3)."
    )


class FabricSpec(ApiModel):
    """How the KV cache crosses nodes: the RDMA device plugin resource, Multus networks, UCX."""

    __rules__ = (
        Rule(
            cel="!has(self.networks) || size(self.networks) == 0 || has(self.rdmaResource)",
            message="networks need rdmaResource: a Multus RDMA network is only usable with "
            "the matching device plugin resource",
            field=".rdmaResource",
            check=lambda f: not f.networks or f.rdma_resource is not None,
        ),
        Rule(
            cel="!has(self.ucx) || !has(self.ucx.gidIndex) || has(self.rdmaResource)",
            message="ucx.gidIndex applies to RoCE devices: set rdmaResource too",
            field=".rdmaResource",
            check=lambda f: f.ucx is None or f.ucx.gid_index is None or f.rdma_resource,
        ),
        Rule(
            # 1, the default, is what objects without rdmaResource were stored with: they stay
            # valid (docs/upgrade.md); any other count asks for units of nothing.
            cel="!has(self.rdmaPerReplica) || self.rdmaPerReplica == 1 || has(self.rdmaResource)",
            message="rdmaPerReplica counts units of rdmaResource: set rdmaResource too",
            field=".rdmaResource",
            check=lambda f: f.rdma_per_replica == 1 or f.rdma_resource is not None,
        ),
    )

    rdma_resource: ResourceName | None = Field(
        None,
        description="Extended resource of the RDMA device plugin requested by every worker, "
        "e.g. rdma/ib, rdma/rdma_shared_device_a or an SR-IOV resource.",
    )
    rdma_per_replica: int = Field(
        1,
        ge=1,
        le=64,
        description="How many rdmaResource units each worker pod requests; more than 1 needs "
        "rdmaResource.",
    )
    networks: list[DNSLabel] = Field(
        default_factory=list,
        max_length=16,
        description="Multus NetworkAttachmentDefinitions attached to workers "
        "(k8s.v1.cni.cncf.io/networks).",
    )
    ucx: UCXSpec | None = Field(None, description="UCX settings for the transfer backend.")


class KVGeometry(ApiModel):
    """What one token of the model's KV cache is made of (its config.json: num_hidden_layers,
    num_key_value_heads, head_dim, torch_dtype or the KV cache dtype). The defaults are
    Llama-3.1-8B's: 2 x 32 x 8 x 128 x 2 bytes = 128 KiB per token."""

    layers: int = Field(32, ge=1, le=1024, description="Transformer layers (num_hidden_layers).")
    kv_heads: int = Field(
        8, ge=1, le=1024, description="KV heads (num_key_value_heads; attention heads for MHA)."
    )
    head_dim: int = Field(128, ge=1, le=4096, description="Size of one attention head.")
    dtype: Literal["bfloat16", "float16", "float8"] = Field(
        "bfloat16", description="KV cache dtype (float8 with --kv-cache-dtype fp8)."
    )


class PreflightSpec(ApiModel):
    """The KV transport preflight: when the pools first become ready, and after
    kvTransfer changes, a decode pod READs a prompt-sized KV payload from a prefill pod over
    NIXL; the KVTransportReady condition reports the transport, bandwidth and the KV transfer
    time of a typical prompt (docs/kv-preflight.md)."""

    enabled: bool = Field(True, description="Run the preflight and report KVTransportReady.")
    port: PortNumber = Field(
        5590, description="Port of the preflight listener the agent runs in every worker pod."
    )
    prompt_tokens: int = Field(
        4096,
        ge=16,
        le=1_000_000,
        description="Typical prompt length: the payload moved, and the prompt whose expected "
        "KV transfer time is reported.",
    )
    block_size: int = Field(
        16,
        ge=1,
        le=4096,
        description="vLLM's KV block size (--block-size): one READ descriptor per block, K and "
        "V of each layer apart, as the NixlConnector reads them.",
    )
    iterations: int = Field(5, ge=1, le=100, description="Timed READs of the whole payload.")
    min_bandwidth_gbps: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="Warn (KVTransportReady=False, LowBandwidth, and an Event) when the "
        "measured bandwidth in GB/s is below this. Unset: only a TCP fallback warns.",
    )
    geometry: KVGeometry = Field(
        default_factory=KVGeometry,
        json_schema_extra=EMPTY_OBJECT,
        description="The model's KV cache geometry, which sizes the payload.",
    )


class KVTransferSpec(ApiModel):
    """How decode workers pull the KV cache from prefill workers (vLLM's NixlConnector)."""

    connector: Literal["NixlConnector", "NixlPullConnector", "NixlPushConnector"] = Field(
        "NixlConnector", description="vLLM KV connector (kv_transfer_config.kv_connector)."
    )
    backends: list[Literal["UCX", "LIBFABRIC"]] = Field(
        default_factory=lambda: list[Literal["UCX", "LIBFABRIC"]](["UCX"]),
        min_length=1,
        max_length=2,
        description="NIXL backends, in order (kv_connector_extra_config.backends).",
    )
    buffer_device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="Where the KV transfer buffer lives; cpu stages through host memory.",
    )
    load_failure_policy: Literal["fail", "recompute"] = Field(
        "fail",
        description="What decode does when it cannot load the KV cache: fail the request "
        "(retryable 500) or recompute the prompt locally.",
    )
    lease_seconds: int | None = Field(
        None,
        ge=1,
        le=3600,
        description="How long a prefill keeps KV that no decode has read before it frees the "
        "blocks (kv_connector_extra_config.kv_lease_duration); unset keeps vLLM's default "
        "(30 s). Raise it where decodes can take longer than that to start a request.",
    )
    side_channel_port: int = Field(
        5600,
        ge=1024,
        le=65536 - MAX_DATA_PARALLEL,
        description="Base NIXL side-channel port (VLLM_NIXL_SIDE_CHANNEL_PORT); data-parallel "
        f"rank r listens on base + r, so the {MAX_DATA_PARALLEL} ports from here on are kept "
        "for it.",
    )
    fabric: FabricSpec | None = Field(
        None, description="The RDMA fabric; unset means the pod network (TCP) only."
    )
    preflight: PreflightSpec = Field(
        default_factory=PreflightSpec,
        json_schema_extra=EMPTY_OBJECT,
        description="Measure the KV transport between the pools before trusting it.",
    )


# ---------------------------------------------------------------------------------------------
# Roles


class ReplicaBounds(ApiModel):
    """Replica bounds of a pool. The operator and its autoscaler stay inside them."""

    __rules__ = (
        Rule(
            cel="self.min <= self.max",
            message="min must not exceed max",
            field=".min",
            check=lambda r: r.min <= r.max,
        ),
        Rule(
            cel="!has(self.initial) || (self.min <= self.initial && self.initial <= self.max)",
            message="initial must lie between min and max",
            field=".initial",
            check=lambda r: r.initial is None or r.min <= r.initial <= r.max,
        ),
    )

    min: int = Field(1, ge=0, le=1000, description="Fewest replicas.")
    max: int = Field(ge=1, le=1000, description="Most replicas.")
    initial: int | None = Field(
        None,
        ge=0,
        le=1000,
        description="Replicas when autoscaling is off or has not decided yet; defaults to min.",
    )

    @property
    def start(self) -> int:
        return self.min if self.initial is None else self.initial


class Parallelism(ApiModel):
    """Parallelism of one worker pod; the pod requests tensor x data GPUs."""

    tensor: int = Field(1, ge=1, le=64, description="Tensor-parallel size.")
    data: int = Field(1, ge=1, le=MAX_DATA_PARALLEL, description="Data-parallel ranks in one pod.")

    @property
    def gpus(self) -> int:
        return self.tensor * self.data


class Toleration(ApiModel):
    """A core/v1 Toleration."""

    __rules__ = (
        Rule(
            cel="self.operator != 'Exists' || !has(self.value)",
            message="a toleration with operator Exists takes no value",
            field=".value",
            check=lambda t: t.operator != "Exists" or t.value is None,
        ),
    )

    key: str | None = Field(None, max_length=316, description="Taint key; empty matches all.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, max_length=63, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to tolerate; empty matches all."
    )
    toleration_seconds: int | None = Field(
        None, ge=0, le=10**9, description="How long a NoExecute taint is tolerated, in seconds."
    )


class Resources(ApiModel):
    """CPU, memory and other resources of a worker. GPUs and the RDMA resource are derived
    from parallelism and kvTransfer.fabric, so they are not set here."""

    __rules__ = (
        Rule(
            cel="!has(self.limits) || !('nvidia.com/gpu' in self.limits)",
            message="do not set nvidia.com/gpu: the GPU count is parallelism.tensor x "
            "parallelism.data",
            field=".limits",
            check=lambda r: "nvidia.com/gpu" not in r.limits,
        ),
        Rule(
            cel="!has(self.requests) || !('nvidia.com/gpu' in self.requests)",
            message="do not set nvidia.com/gpu: the GPU count is parallelism.tensor x "
            "parallelism.data",
            field=".requests",
            check=lambda r: "nvidia.com/gpu" not in r.requests,
        ),
    )

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Resource requests, e.g. cpu: 8, memory: 64Gi."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Resource limits; memory usually equals requests."
    )


class RoleSpec(ApiModel):
    """One pool of vLLM workers (prefill or decode): size, parallelism, resources, placement."""

    replicas: ReplicaBounds = Field(description="Replica bounds and starting count.")
    parallelism: Parallelism = Field(
        default_factory=Parallelism,
        json_schema_extra=EMPTY_OBJECT,
        description="Tensor and data parallelism of each pod.",
    )
    resources: Resources = Field(
        default_factory=Resources,
        json_schema_extra=EMPTY_OBJECT,
        description="CPU, memory and other non-GPU resources of each pod.",
    )
    gpu_resource: ResourceName = Field(
        "nvidia.com/gpu", description="Extended resource name of the GPU device plugin."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the pool runs on, e.g. nvidia.com/gpu.product: NVIDIA-H200.",
    )
    affinity: FreeFormObject | None = Field(
        None, description="Pod affinity rules (core/v1 Affinity), added to the pool's pods."
    )
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration.model_validate(GPU_TOLERATION)],
        json_schema_extra={"default": [dict(GPU_TOLERATION)]},
        max_length=32,
        description="Tolerations of the pool's pods; the default tolerates the usual GPU taint.",
    )
    priority_class_name: str | None = Field(
        None, min_length=1, max_length=253, description="PriorityClass of the pool's pods."
    )
    shared_memory: Quantity = Field(
        "16Gi", description="Size of the memory-backed /dev/shm (NCCL, NIXL host buffers)."
    )
    extra_args: list[ExtraArg] = Field(
        default_factory=list,
        max_length=64,
        description="Extra `vllm serve` arguments for this role only (after engine.extraArgs).",
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Extra environment for this role only."
    )

    @property
    def gpus_per_replica(self) -> int:
        return self.parallelism.gpus


# ---------------------------------------------------------------------------------------------
# Router, SLOs, autoscaling, drain


class RouterSpec(ApiModel):
    """The P/D router in front of the pools."""

    type: Literal["vllm-router", "external"] = Field(
        "vllm-router",
        description="vllm-router: deployed and kept in step by pdfleet. external: bring your "
        "own gateway; pdfleet only labels the pools for it.",
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description="Router image; defaults to the image the operator was installed with.",
    )
    replicas: int = Field(1, ge=1, le=32, description="Router replicas.")
    port: PortNumber = Field(8000, description="Serving port of the router.")
    metrics_port: PortNumber = Field(29000, description="The router's Prometheus port.")
    policy: Literal["random", "round_robin", "cache_aware", "power_of_two", "consistent_hash"] = (
        Field("power_of_two", description="Worker selection policy for both stages.")
    )
    health_check_interval: Annotated[Duration, duration_between("1s", "1h")] = Field(
        "5s", description="How often the router checks worker health."
    )
    resources: Resources = Field(
        default_factory=Resources,
        json_schema_extra=EMPTY_OBJECT,
        description="Resources of each router pod.",
    )


class LatencyTarget(ApiModel):
    """A latency target at a percentile."""

    target: Annotated[Duration, duration_between("1ms", "1h")] = Field(
        description="Latency target, e.g. 500ms."
    )
    percentile: float = Field(
        90, gt=0, lt=100, description="Percentile the target applies to, in (0, 100)."
    )

    @property
    def seconds(self) -> float:
        return parse_duration(self.target)


class SLOSpec(ApiModel):
    """Service-level objectives the autoscaler keeps."""

    ttft: LatencyTarget = Field(description="Time to first token.")
    itl: LatencyTarget = Field(description="Inter-token latency (time per output token).")
    window: Annotated[Duration, duration_between("10s", "6h")] = Field(
        "2m", description="Window over which the percentiles are measured."
    )


class PrometheusSpec(ApiModel):
    """Where the autoscaler reads worker metrics."""

    url: str = Field(
        max_length=1024,
        # Spelt-out ASCII white space: RE2 (the API server) and pydantic's regex engine
        # disagree on what \s matches beyond it.
        pattern=r"^https?://[^\t\n\f\r /]+(/[^\t\n\f\r ]*)?$",
        description="Base URL of the Prometheus HTTP API, e.g. http://prometheus.monitoring:9090.",
    )


class CapacityHintSpec(ApiModel):
    """What one replica of each role sustains at the SLO targets, from a profile or a benchmark.

    Optional: without it the autoscaler grows on SLO violations until it has seen where a
    replica saturates; with it, it sizes ahead of the first violation. Either way it keeps
    correcting the figures online (docs/autoscaling.md)."""

    prefill_prompt_tokens_per_second: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Prompt tokens per second one prefill replica processes within the TTFT "
        "target.",
    )
    decode_generated_tokens_per_second: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Generated tokens per second one decode replica produces within the ITL "
        "target.",
    )


class ScaleToZeroSpec(ApiModel):
    """Both pools sleep together while no request comes, and wake on the next one
    (docs/design/scale-to-zero.md). An activator in front of the router holds requests while the
    pools are at zero, so none is refused; clients use the activator's Service
    (status.endpoint)."""

    idle_after: Annotated[Duration, duration_between("1m", "24h")] = Field(
        "15m",
        description="With no request arriving or in flight this long, both pools drain to zero.",
    )
    max_wait: Annotated[Duration, duration_between("1s", "1h")] = Field(
        "5m",
        description="Longest a request is held while the pools wake; then it gets 503 with "
        "Retry-After. Cover the workers' start-up (weights loaded, KV preflight passed).",
    )


class AutoscalingSpec(ApiModel):
    """SLO-driven autoscaling of both pools inside a GPU budget.

    Decisions go to status and to the StatefulSets; the spec is never written, so GitOps tools
    see no drift."""

    __rules__ = (
        Rule(
            cel="!has(self.enabled) || !self.enabled || has(self.gpuBudget)",
            message="enabled autoscaling needs gpuBudget",
            field=".gpuBudget",
            check=lambda a: not a.enabled or a.gpu_budget is not None,
        ),
        Rule(
            cel="!has(self.enabled) || !self.enabled || has(self.prometheus)",
            message="enabled autoscaling needs prometheus.url",
            field=".prometheus",
            check=lambda a: not a.enabled or a.prometheus is not None,
        ),
        Rule(
            cel="!has(self.scaleToZero) || (has(self.enabled) && self.enabled)",
            message="scaleToZero needs enabled autoscaling: it wakes to the autoscaler's "
            "last decision",
            field=".scaleToZero",
            check=lambda a: a.scale_to_zero is None or a.enabled,
        ),
    )

    enabled: bool = Field(False, description="Turn the autoscaler on.")
    gpu_budget: int | None = Field(
        None, ge=1, le=100_000, description="Prefill plus decode GPUs never exceed this."
    )
    prometheus: PrometheusSpec | None = Field(None, description="Metrics source.")
    interval: Annotated[Duration, duration_between("1s", "1h")] = Field(
        "30s", description="Time between decisions."
    )
    scale_up_stabilization: Annotated[Duration, duration_between("0s", "24h")] = Field(
        "60s",
        description="A scale-down is not reversed by a scale-up sooner than this; 0s: no "
        "stabilization.",
    )
    scale_down_stabilization: Annotated[Duration, duration_between("1s", "24h")] = Field(
        "300s",
        description="Load must stay low this long before a pool shrinks, and a scale-up is not "
        "reversed sooner.",
    )
    max_scale_up_step: int = Field(
        4, ge=1, le=1000, description="Most replicas added to one pool in one decision."
    )
    max_scale_down_step: int = Field(
        1, ge=1, le=1000, description="Most replicas removed from one pool in one decision."
    )
    worker_startup: Annotated[Duration, duration_between("1s", "24h")] = Field(
        "120s",
        description="How long a new worker takes to serve (pull, load weights, warm up): the "
        "autoscaler sizes for the load expected by the time new workers are ready.",
    )
    capacity_hint: CapacityHintSpec | None = Field(
        None, description="Starting per-replica capacities; learned online when absent."
    )
    scale_to_zero: ScaleToZeroSpec | None = Field(
        None,
        description="Opt in to scaling both pools to zero while idle, with requests held, "
        "not refused, while they wake. Needs router.type vllm-router.",
    )


class DrainSpec(ApiModel):
    """How workers leave: drained and deregistered before they are removed."""

    timeout: Annotated[Duration, duration_between("1s", "24h")] = Field(
        "300s",
        description="Longest wait for in-flight requests of a draining worker; then it is "
        "removed anyway (an Event says so). Also vLLM's --shutdown-timeout.",
    )


class NetworkPolicySpec(ApiModel):
    """NetworkPolicies around the fleet (docs/security.md): workers accept traffic only from
    their router, each other (NIXL side channel, UCX), the operator and monitoring; the
    router's serving port only from routerClients and the operator. Needs a CNI that enforces
    NetworkPolicy."""

    enabled: bool = Field(False, description="Render NetworkPolicies for the workers and router.")
    router_clients: list[FreeFormObject] = Field(
        default_factory=list,
        max_length=16,
        description="NetworkPolicyPeers (core/v1 form: podSelector, namespaceSelector, "
        "ipBlock) allowed to reach the router's serving port, e.g. your Gateway's pods. The "
        "router's admin API shares that port, so list the path-filtering front, not clients. "
        "Empty: only the operator.",
    )
    monitoring: list[FreeFormObject] = Field(
        default_factory=list,
        max_length=16,
        description="NetworkPolicyPeers allowed to scrape worker and router metrics, e.g. "
        "{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}.",
    )


# ---------------------------------------------------------------------------------------------
# The spec


def _initial_gpus(spec: InferenceServiceSpec) -> int:
    return sum(role.replicas.start * role.gpus_per_replica for role in (spec.prefill, spec.decode))


def _cel_initial(role: str) -> str:
    r = f"self.{role}.replicas"
    gpus = f"self.{role}.parallelism.tensor * self.{role}.parallelism.data"
    return f"(has({r}.initial) ? {r}.initial : {r}.min) * {gpus}"


def _replica_fits_budget(role: str) -> Rule:
    """One replica of `role` (tensor x data GPUs) fits the GPU budget: the autoscaler could
    otherwise never add one, whatever the other pool gives up."""
    return Rule(
        cel="!has(self.autoscaling) || !has(self.autoscaling.gpuBudget) || "
        f"self.{role}.parallelism.tensor * self.{role}.parallelism.data "
        "<= self.autoscaling.gpuBudget",
        message=f"one {role} replica (parallelism.tensor x parallelism.data GPUs) needs more "
        "GPUs than autoscaling.gpuBudget",
        field=".autoscaling.gpuBudget",
        check=lambda s: (
            s.autoscaling.gpu_budget is None
            or s.role(role).gpus_per_replica <= s.autoscaling.gpu_budget
        ),
    )


def _field(obj: Any, path: str) -> Any:
    """The value at a camelCase path such as "kvTransfer.preflight.port"."""
    for part in path.split("."):
        obj = getattr(obj, to_snake(part))
    return obj


def _when_set(paths: Sequence[str], condition: str) -> str:
    """CEL: `condition` whenever every field on `paths` is set. The API server also checks a
    rule against a CRD default such as {}, where they are not."""
    steps = [
        ".".join(path.split(".")[:end])
        for path in paths
        for end in range(1, 1 + len(path.split(".")))
    ]
    present = " && ".join(f"has(self.{step})" for step in dict.fromkeys(steps))
    return f"!({present}) || {condition}"


def _ports_differ(port: str, other: str) -> Rule:
    """Two listeners of one pod: the second could not bind, and the API server refuses a
    Service that names one port twice."""
    return Rule(
        cel=_when_set((port, other), f"self.{port} != self.{other}"),
        message=f"{port} must differ from {other}: both listen in the same pod",
        field=f".{port}",
        check=lambda s: _field(s, port) != _field(s, other),
    )


def _outside_side_channels(port: str) -> Rule:
    """A worker listener must not take one of the side-channel ports (one per data-parallel
    rank from kvTransfer.sideChannelPort on)."""
    base = "kvTransfer.sideChannelPort"
    return Rule(
        cel=_when_set(
            (port, base),
            f"self.{port} < self.{base} || self.{port} >= self.{base} + {MAX_DATA_PARALLEL}",
        ),
        message=f"{port} must lie outside the side-channel ports ({base} up to {base} + "
        f"{MAX_DATA_PARALLEL - 1}, one per data-parallel rank)",
        field=f".{port}",
        check=lambda s: not 0 <= _field(s, port) - _field(s, base) < MAX_DATA_PARALLEL,
    )


class InferenceServiceSpec(ApiModel):
    """A prefill/decode disaggregated vLLM fleet behind one router."""

    __rules__ = (
        _replica_fits_budget("prefill"),
        _replica_fits_budget("decode"),
        Rule(
            cel="!has(self.autoscaling) || !has(self.autoscaling.enabled) || "
            "!self.autoscaling.enabled || has(self.slo)",
            message="enabled autoscaling needs slo targets",
            field=".slo",
            check=lambda s: not s.autoscaling.enabled or s.slo is not None,
        ),
        Rule(
            cel="!has(self.autoscaling) || !has(self.autoscaling.gpuBudget) || "
            f"{_cel_initial('prefill')} + {_cel_initial('decode')} "
            "<= self.autoscaling.gpuBudget",
            message="the initial prefill and decode replicas need more GPUs than "
            "autoscaling.gpuBudget",
            field=".autoscaling.gpuBudget",
            check=lambda s: (
                s.autoscaling.gpu_budget is None or _initial_gpus(s) <= s.autoscaling.gpu_budget
            ),
        ),
        Rule(
            cel="!has(self.autoscaling) || !has(self.autoscaling.gpuBudget) || "
            "self.prefill.replicas.min * self.prefill.parallelism.tensor * "
            "self.prefill.parallelism.data + self.decode.replicas.min * "
            "self.decode.parallelism.tensor * self.decode.parallelism.data "
            "<= self.autoscaling.gpuBudget",
            message="prefill and decode minimum replicas need more GPUs than autoscaling.gpuBudget",
            field=".autoscaling.gpuBudget",
            check=lambda s: (
                s.autoscaling.gpu_budget is None
                or s.prefill.replicas.min * s.prefill.gpus_per_replica
                + s.decode.replicas.min * s.decode.gpus_per_replica
                <= s.autoscaling.gpu_budget
            ),
        ),
        Rule(
            cel="!has(self.autoscaling) || !has(self.autoscaling.scaleToZero) || "
            "!has(self.router) || !has(self.router.type) || self.router.type == 'vllm-router'",
            message="scaleToZero needs router.type vllm-router: the activator holds requests "
            "in front of the router pdfleet deploys",
            field=".autoscaling.scaleToZero",
            check=lambda s: s.autoscaling.scale_to_zero is None or s.router.type == "vllm-router",
        ),
        # The ports of a worker pod, and of a router pod, are distinct.
        _outside_side_channels("engine.port"),
        _outside_side_channels("kvTransfer.preflight.port"),
        _ports_differ("kvTransfer.preflight.port", "engine.port"),
        _ports_differ("router.metricsPort", "router.port"),
    )

    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(description="The vLLM engine image and its arguments.")
    kv_transfer: KVTransferSpec = Field(
        default_factory=KVTransferSpec,
        json_schema_extra=EMPTY_OBJECT,
        description="KV cache transfer between the pools.",
    )
    prefill: RoleSpec = Field(description="The prefill pool.")
    decode: RoleSpec = Field(description="The decode pool.")
    router: RouterSpec = Field(
        default_factory=RouterSpec,
        json_schema_extra=EMPTY_OBJECT,
        description="The P/D router in front.",
    )
    slo: SLOSpec | None = Field(None, description="Latency objectives.")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec,
        json_schema_extra=EMPTY_OBJECT,
        description="SLO-driven autoscaling.",
    )
    drain: DrainSpec = Field(
        default_factory=DrainSpec,
        json_schema_extra=EMPTY_OBJECT,
        description="Graceful scale-down.",
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec,
        json_schema_extra=EMPTY_OBJECT,
        description="Optional NetworkPolicies for the workers and the router.",
    )
    progress_deadline: Annotated[Duration, duration_between("1s", "24h")] = Field(
        "10m",
        description="How long a pod may stay not Ready before the service is reported "
        "Stalled=True with the cause (an image it cannot pull, a crash loop, a missing volume "
        "or network, too few GPUs, or no progress at all), like a Deployment's "
        "progressDeadlineSeconds. Raise it where weights take longer to download and load.",
    )

    def role(self, name: str) -> RoleSpec:
        if name == labels.ROLE_PREFILL:
            return self.prefill
        if name == labels.ROLE_DECODE:
            return self.decode
        raise ValueError(f"unknown role {name!r}")


# ---------------------------------------------------------------------------------------------
# Status


class Condition(ApiModel):
    """A kstatus-compatible condition (the metav1.Condition shape)."""

    type: str = Field(max_length=316, description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field("", max_length=1024, description="CamelCase reason.")
    message: str = Field("", max_length=32768, description="Human-readable details.")
    last_transition_time: str | None = Field(
        None, description="When status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        None, description="The generation this condition was computed for."
    )


class RoleStatus(ApiModel):
    """Observed state of one pool."""

    desired: int = Field(0, description="Replicas the operator wants now.")
    replicas: int = Field(0, description="Pods that exist.")
    ready: int = Field(0, description="Pods that are ready and registered with the router.")
    pending: int = Field(0, description="Pods not scheduled or not started yet.")
    draining: int = Field(0, description="Pods being drained before removal.")
    summary: str = Field("", description="ready/desired, for kubectl get.")


class SLOStatus(ApiModel):
    """Measured latency against the SLO."""

    ttft_seconds: float | None = Field(None, description="Measured TTFT at the SLO percentile.")
    itl_seconds: float | None = Field(
        None,
        description="Measured ITL at the SLO percentile, per request: its time per output "
        "token, what the autoscaler judges decode on (the window's mean ITL while no request "
        "finished in it).",
    )
    ttft: str = Field("", description="Measured/target TTFT, for kubectl get.")
    itl: str = Field("", description="Measured/target ITL, for kubectl get.")
    window: str = Field("", description="Window the figures cover.")
    attainment: float | None = Field(
        None,
        description="Estimated share of the window's requests meeting both targets, from "
        "the TTFT and per-request time-per-output-token histograms; absent when their "
        "buckets cannot place a target.",
    )


class AutoscalerStatus(ApiModel):
    """The autoscaler's latest decision."""

    last_decision: str = Field("", description="e.g. prefill 2->3, decode 4->3.")
    reason: str = Field("", description="Why the decision was taken.")
    last_decision_time: str | None = Field(None, description="When (RFC 3339).")
    last_scale_up_time: str | None = Field(None, description="Last scale-up of either pool.")
    last_scale_down_time: str | None = Field(None, description="Last scale-down of either pool.")


class KVTransportStatus(ApiModel):
    """The latest KV transport preflight (the KVTransportReady condition says the verdict)."""

    fingerprint: str = Field("", description="Of the kvTransfer spec the run measured.")
    measured_time: str | None = Field(None, description="When it ran (RFC 3339).")
    prefill_pod: str = Field("", description="The prefill pod read from.")
    decode_pod: str = Field("", description="The decode pod that read.")
    transport: str = Field(
        "", description="UCX transport of the reads, e.g. rc_mlx5/mlx5_0:1 or tcp/eth0."
    )
    transport_kind: str = Field(
        "", description="rdma, cuda_ipc, cuda_copy, shm, tcp, self or unknown."
    )
    memory: str = Field("", description="DRAM (host memory) or VRAM (GPU memory).")
    bandwidth_gbps: float | None = Field(None, description="Measured bandwidth, GB/s.")
    latency_ms: float | None = Field(None, description="Median time of a one-block READ.")
    payload_bytes: int = Field(0, description="Bytes moved per timed READ.")
    expected_transfer_seconds: float | None = Field(
        None, description="Expected KV transfer time of a preflight.promptTokens prompt."
    )
    verified: bool = Field(False, description="The data read matched what was written.")
    error: str = Field("", description="Why the run failed, when it did.")


class RevisionStatus(ApiModel):
    """The pods of one KV revision (everything that decides whether KV moves between a
    prefill and a decode: docs/upgrade.md)."""

    revision: str = Field(description="The KV revision (the pods' pdfleet.dev/kv-revision).")
    prefill: int = Field(0, description="Prefill pods of this revision.")
    decode: int = Field(0, description="Decode pods of this revision.")
    serving: bool = Field(
        False, description="The router pairs this revision's pods (never two revisions)."
    )


class RolloutStatus(ApiModel):
    """A revision-paired rollout in progress."""

    phase: Literal["Surging", "MovingTraffic", "Retiring", "Reverting"] = Field(
        description="Surging (the new revision starts beside the old, which serves), "
        "MovingTraffic (the router moves to the new revision), Retiring (the old drains), "
        "Reverting (the spec went back before traffic moved; the new pods go)."
    )
    revision: str = Field(description="The revision being rolled out (the spec's).")
    serving_revision: str = Field(description="The revision the router pairs now.")
    started_time: str | None = Field(None, description="When this rollout began (RFC 3339).")
    message: str = Field("", description="What the rollout waits for.")


class PoolSizes(ApiModel):
    """Replicas of both pools."""

    prefill: int = Field(0, description="Prefill replicas.")
    decode: int = Field(0, description="Decode replicas.")


class ScaleToZeroStatus(ApiModel):
    """Where a service that scales to zero stands (docs/design/scale-to-zero.md)."""

    state: Literal["Awake", "Idle", "Waking"] = Field(
        description="Awake (the autoscaler sizes the pools), Idle (both pools at zero; the "
        "activator holds requests), Waking (a held request woke it; the pools start)."
    )
    since: str | None = Field(None, description="When the state began (RFC 3339).")
    last_busy: PoolSizes | None = Field(
        None,
        description="The pools' sizes the last time requests were in flight: a wake starts "
        "both pools at these sizes (within the bounds and gpuBudget).",
    )
    held_requests: int = Field(0, description="Requests the activator held at the last read.")
    wake_seconds: float | None = Field(
        None,
        description="The last wake: from the oldest held request's arrival to a Ready "
        "prefill and decode.",
    )
    message: str = Field("", description="Why the state is what it is.")


class InferenceServiceStatus(ApiModel):
    """Observed state, written by the operator once per reconcile pass."""

    observed_generation: int | None = Field(
        None, description="The spec generation this status describes."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Reconciling, Stalled (kstatus) and specific conditions.",
    )
    prefill: RoleStatus | None = Field(None, description="The prefill pool.")
    decode: RoleStatus | None = Field(None, description="The decode pool.")
    slo: SLOStatus | None = Field(None, description="Measured latency.")
    autoscaler: AutoscalerStatus | None = Field(None, description="Latest decision.")
    kv_transport: KVTransportStatus | None = Field(
        None, description="The latest KV transport preflight."
    )
    endpoint: str | None = Field(None, description="URL clients send requests to.")
    revision: str | None = Field(None, description="The spec's KV revision.")
    revisions: list[RevisionStatus] = Field(
        default_factory=list, description="The KV revisions pods run, and which one serves."
    )
    rollout: RolloutStatus | None = Field(
        None, description="The revision-paired rollout in progress, if any."
    )
    scale_to_zero: ScaleToZeroStatus | None = Field(
        None, description="Sleep and wake, with autoscaling.scaleToZero."
    )


class ObjectMeta(ApiModel):
    """The parts of metadata the models read; the API server owns the rest."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    namespace: str | None = None
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class InferenceService(ApiModel):
    """A prefill/decode disaggregated LLM inference fleet: a prefill pool and a decode pool of
    vLLM workers moving the KV cache over NIXL, a P/D router in front, and an SLO-driven
    autoscaler that rebalances the two pools inside a GPU budget."""

    __rules__ = (
        Rule(
            cel="size(self.metadata.name) <= 44",
            message="metadata.name must be at most 44 characters: pod names and labels of the "
            "pools are derived from it",
            field=".metadata.name",
            check=lambda o: o.metadata.name is None or len(o.metadata.name) <= 44,
        ),
        Rule(
            cel=f"self.metadata.name.matches('{SERVICE_NAME_PATTERN}')",
            message="metadata.name must start with a letter and hold only lower-case letters, "
            "digits and '-': the router's Service is named after it (an RFC 1035 label)",
            field=".metadata.name",
            check=lambda o: (
                o.metadata.name is None
                or re.fullmatch(SERVICE_NAME_PATTERN, o.metadata.name) is not None
            ),
        ),
    )

    api_version: Literal["pdfleet.dev/v1alpha1"] = "pdfleet.dev/v1alpha1"
    kind: Literal["InferenceService"] = "InferenceService"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: InferenceServiceSpec
    status: InferenceServiceStatus | None = None
