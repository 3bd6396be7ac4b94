"""What the operator sets in a worker pod itself: the `vllm serve` flags and the environment
variables a spec may not set, each with the field (or the reason) that owns it.

The one list both sides read. The API models turn it into admission rules (CEL and Python
alike): an `extraArgs` item or an `env` name that would override one of these is refused,
naming the spec field to use instead, because the rest of the fleet (Services, probes,
NetworkPolicies, the router, the KV preflight) is built from that field, not from the flag.
The renderer merges the user's env over the operator's with it, so a pod never carries one
name twice. Every flag the agent's launcher sets from the spec
(pdfleet_worker.launcher.build_vllm_command) and every variable the renderer sets
(pdfleet.render.worker.worker_env) is listed here; unit tests hold them in step.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdfleet.api.rules import ValueRule

SET_BY_OPERATOR = "is set by the operator"


def _cel_string(text: str) -> str:
    """`text` as a single-quoted CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def option_key(arg: str) -> str:
    """The option an argument names, as vLLM's parser reads it: before any "=value" and any
    ".key" (dict flags take --flag.key=value), with underscores for dashes."""
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


# option_key in CEL (Kubernetes' strings library) as a one-item list, whose macros bind it to
# `k` in the rules below (CRD validation has no cel.bind).
_CEL_OPTION_KEY = "[self.split('=')[0].split('.')[0].replace('_', '-')]"


@dataclass(frozen=True)
class OwnedFlag:
    """A `vllm serve` flag the launcher sets from the spec."""

    flag: str
    """The long spelling, e.g. --port."""
    source: str
    """Where its value comes from, completing "--port is set by the operator ..."."""
    aliases: tuple[str, ...] = ()
    """Short spellings, e.g. -tp."""

    @property
    def message(self) -> str:
        return f"{self.flag} {SET_BY_OPERATOR} {self.source}"

    def set_by(self, key: str) -> bool:
        """Whether an option key (`option_key`) sets this flag: its long spelling or any
        abbreviation argparse expands to it, or a short spelling."""
        # more than two characters and a prefix of the flag: "--" and more
        return (len(key) > 2 and self.flag.startswith(key)) or key in self.aliases

    @property
    def cel(self) -> str:
        """`set_by` in CEL, of the key bound to `k`."""
        long = f"(size(k) > 2 && {_cel_string(self.flag)}.startsWith(k))"
        short = [f"k == {_cel_string(alias)}" for alias in self.aliases]
        return f"({' || '.join([long, *short])})" if short else long


OWNED_FLAGS: tuple[OwnedFlag, ...] = (
    OwnedFlag("--model", "from spec.model.name and spec.model.source"),
    OwnedFlag("--served-model-name", "from spec.model.name"),
    OwnedFlag("--host", "(workers listen on every address of their pod)"),
    OwnedFlag("--port", "from spec.engine.port"),
    OwnedFlag(
        "--tensor-parallel-size",
        "from spec.prefill.parallelism.tensor and spec.decode.parallelism.tensor",
        ("-tp",),
    ),
    OwnedFlag(
        "--data-parallel-size",
        "from spec.prefill.parallelism.data and spec.decode.parallelism.data",
        ("-dp",),
    ),
    OwnedFlag("--kv-transfer-config", "from spec.kvTransfer"),
    OwnedFlag("--max-model-len", "from spec.model.maxModelLen"),
    OwnedFlag(
        "--shutdown-timeout",
        "(a drained worker stops within the operator's shutdown timeout; spec.drain.timeout "
        "bounds the drain)",
    ),
    OwnedFlag("--enable-scale-out", "from spec.router.policy (cache_aware)"),
)

# Refused in env: each is read by the agent, the engine or the preflight with a meaning the
# rest of the fleet depends on (ports the Services and NetworkPolicies open, the address the
# decode pods dial, the pod's identity, the drain timing), or it has a spec field whose
# changes the operator acts on (a kvTransfer change re-runs the KV preflight; env does not).
OWNED_ENV: dict[str, str] = {
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "from the pod IP (the decode pods dial it)",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "from spec.kvTransfer.sideChannelPort",
    "PDFLEET_POD_IP": "from the pod IP (the decode pods dial it)",
    "POD_NAME": "from the pod's name",
    "POD_NAMESPACE": "from the pod's namespace",
    "PDFLEET_ROLE": "from the pool the pod belongs to",
    "PDFLEET_KV_ROLE": "from the pool the pod belongs to",
    "PDFLEET_MODEL": "from spec.model.name and spec.model.source",
    "PDFLEET_MODEL_REVISION": "from spec.model.source.hub.revision",
    "PDFLEET_SERVED_MODEL_NAME": "from spec.model.name",
    "PDFLEET_MAX_MODEL_LEN": "from spec.model.maxModelLen",
    "PDFLEET_HOST": "(workers listen on every address of their pod)",
    "PDFLEET_PORT": "from spec.engine.port",
    "PDFLEET_TP": "from spec.prefill.parallelism.tensor and spec.decode.parallelism.tensor",
    "PDFLEET_DP": "from spec.prefill.parallelism.data and spec.decode.parallelism.data",
    "PDFLEET_EXTRA_ARGS": "from spec.engine.extraArgs and the pools' extraArgs",
    "PDFLEET_SIDE_CHANNEL_PORT": "from spec.kvTransfer.sideChannelPort",
    "PDFLEET_KV_CONNECTOR": "from spec.kvTransfer.connector",
    "PDFLEET_KV_BACKENDS": "from spec.kvTransfer.backends",
    "PDFLEET_KV_BUFFER_DEVICE": "from spec.kvTransfer.bufferDevice",
    "PDFLEET_KV_LOAD_FAILURE_POLICY": "from spec.kvTransfer.loadFailurePolicy",
    "PDFLEET_KV_LEASE_SECONDS": "from spec.kvTransfer.leaseSeconds",
    "PDFLEET_PREFLIGHT_PORT": "from spec.kvTransfer.preflight.port",
    "PDFLEET_ENABLE_SCALE_OUT": "from spec.router.policy (cache_aware)",
    "PDFLEET_SHUTDOWN_TIMEOUT": "(a drained worker stops within the operator's shutdown timeout)",
    "PDFLEET_DRAIN_TIMEOUT": "from spec.drain.timeout",
    "UCX_TLS": "from spec.kvTransfer.fabric.ucx.tls",
    "UCX_NET_DEVICES": "from spec.kvTransfer.fabric.ucx.netDevices",
    "UCX_IB_GID_INDEX": "from spec.kvTransfer.fabric.ucx.gidIndex",
}

# Set by the operator, but the user's value replaces it: nothing else in the fleet reads them.
OVERRIDABLE_ENV: dict[str, str] = {
    "HF_HOME": "where the engine caches hub downloads; the operator's is the pod's cache volume",
    "HF_TOKEN": "the hub token; the engine reads it wherever it comes from, the operator only "
    "passes spec.model.source.hub.tokenSecretRef",
}


# Flags the worker's agent sets whatever the spec says, which an extraArgs item replaces
# (it comes later, and vLLM keeps a flag's last value).
OVERRIDABLE_FLAGS: dict[str, str] = {
    "--custom-histogram-buckets": "histogram bounds; the agent's give the autoscaler's "
    "decode signal and SLO attainment fine inter-token latency buckets (docs/worker.md)",
}


def flag_problem(arg: str) -> str | None:
    """Why an extraArgs item may not be passed to `vllm serve`, or None when it may."""
    key = option_key(arg)
    owned = next((flag for flag in OWNED_FLAGS if flag.set_by(key)), None)
    return None if owned is None else owned.message


def env_problem(name: str) -> str | None:
    """Why a user env entry may not have this name, or None when it may."""
    source = OWNED_ENV.get(name)
    return None if source is None else f"{name} {SET_BY_OPERATOR} {source}"


def _flag_message_expression() -> str:
    *others, last = OWNED_FLAGS
    text = _cel_string(last.message)
    for owned in reversed(others):
        text = f"{owned.cel} ? {_cel_string(owned.message)} : {text}"
    return f"{_CEL_OPTION_KEY}.map(k, {text})[0]"


EXTRA_ARG_RULE = ValueRule(
    cel=f"!{_CEL_OPTION_KEY}.exists(k, " + " || ".join(flag.cel for flag in OWNED_FLAGS) + ")",
    message=f"this flag {SET_BY_OPERATOR}: set its spec field instead",
    problem=flag_problem,
    message_expression=_flag_message_expression(),
)
"""An extraArgs item must not set a flag the operator sets: `--flag value`, `--flag=value`,
`--flag.key=value`, underscores for dashes, an abbreviation or a short spelling."""

ENV_NAME_RULE = ValueRule(
    cel="!(self in [" + ", ".join(_cel_string(name) for name in OWNED_ENV) + "])",
    message=f"this variable {SET_BY_OPERATOR}: set its spec field instead",
    problem=env_problem,
    message_expression=f"self + ' {SET_BY_OPERATOR} ' + {{"
    + ", ".join(f"{_cel_string(n)}: {_cel_string(s)}" for n, s in OWNED_ENV.items())
    + "}[self]",
)
"""A user env entry must not have a name the operator sets and depends on."""
