"""A container's environment as kubelet builds it: envFrom, env, downward API, $(VAR).

Where it fits: the pod worker resolves each container's env with ``resolve_env`` (its
``lookup`` reads Secrets and ConfigMaps through the bridge's API client) before ``commands``
turns the container into a local command; ``expand`` also serves ``command``/``args``. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Lookup = Callable[[str, str], Mapping[str, str] | None]
"""(kind ``secret``|``configmap``, name) -> its data (decoded), or None when absent."""


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are replaced, ``$$`` escapes ``$``."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(sub, value)


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: Mapping[str, Any], path: str, pod_ip: str, host_ip: str) -> str | None:
    """The value of a downward-API ``fieldRef`` (the fields kubelet supports for env)."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        value = simple[path]
        return None if value is None else str(value)
    match = _SUBSCRIPT.match(path)
    if match:
        found = (meta.get(match.group(1)) or {}).get(match.group(2))
        return None if found is None else str(found)
    return None


def resolve_env(
    container: Mapping[str, Any],
    pod: Mapping[str, Any],
    pod_ip: str,
    host_ip: str,
    lookup: Lookup | None = None,
) -> dict[str, str]:
    """A container's environment as kubelet would build it: ``envFrom`` first, then ``env``
    in order (later entries win), with ``value``, ``fieldRef``, ``secretKeyRef`` and
    ``configMapKeyRef`` (through ``lookup``; missing ones are left out) and ``$(VAR)``
    expansion. ``resourceFieldRef`` has no local meaning and is left out."""
    out: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for kind, ref_key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = source.get(ref_key)
            if ref and lookup is not None:
                data = lookup(kind, str(ref.get("name", ""))) or {}
                prefix = str(source.get("prefix", ""))
                out.update({prefix + k: str(v) for k, v in data.items()})
    for item in container.get("env") or []:
        name = str(item["name"])
        value: str | None
        if "value" in item or "valueFrom" not in item:
            value = expand(str(item.get("value", "")), out)
        else:
            value = _value_from(item["valueFrom"], pod, pod_ip, host_ip, lookup)
        if value is not None:
            out[name] = value
    return out


def _value_from(
    source: Mapping[str, Any],
    pod: Mapping[str, Any],
    pod_ip: str,
    host_ip: str,
    lookup: Lookup | None,
) -> str | None:
    if "fieldRef" in source:
        return field_ref(pod, str(source["fieldRef"].get("fieldPath", "")), pod_ip, host_ip)
    for kind, ref_key in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
        ref = source.get(ref_key)
        if ref is not None:
            if lookup is None:
                return None
            data = lookup(kind, str(ref.get("name", ""))) or {}
            found = data.get(str(ref.get("key", "")))
            return None if found is None else str(found)
    return None
