"""Field types shared by the API models: Kubernetes-style durations and quantities.

Each type validates in Python the same way the generated CRD schema validates on the API
server (the pattern below is emitted verbatim into the CRD), so a spec that passes one passes
the other.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema

from pdfleet.api.rules import Checked, ValueRule

# Go's time.ParseDuration units that make sense for serving: "500ms", "30s", "5m", "1h30m".
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
DURATION_MAX_LENGTH = 32
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

# resource.Quantity's canonical forms: plain numbers, decimal SI and binary suffixes.
QUANTITY_PATTERN = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
_QUANTITY = re.compile(QUANTITY_PATTERN)
_QUANTITY_SUFFIX = {
    "": 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def parse_duration(text: str) -> float:
    """Seconds in a duration string such as "1m30s" or "250ms"; ValueError when malformed."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration such as 500ms, 30s, 5m or 1h")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


def format_duration(seconds: float) -> str:
    """The shortest readable form of a duration in seconds: 0.41 -> "410ms", 90 -> "90s"."""
    if seconds < 1:
        return f"{round(seconds * 1000):d}ms"
    if seconds < 10:
        return f"{seconds:.2f}".rstrip("0").rstrip(".") + "s"
    return f"{round(seconds):d}s"


def parse_quantity(value: int | str) -> float:
    """The numeric value of a Kubernetes quantity ("20Gi" -> 21474836480.0)."""
    text = str(value)
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity such as 500m, 16, 20Gi or 1e3")
    exponent = match.group(3) or ""
    if exponent[:1] in ("e", "E"):
        return float(text)
    return float(text[: len(text) - len(exponent)]) * _QUANTITY_SUFFIX[exponent]


def _check_duration(value: Any) -> Any:
    if isinstance(value, str):
        if len(value) > DURATION_MAX_LENGTH:
            raise ValueError(f"a duration has at most {DURATION_MAX_LENGTH} characters")
        parse_duration(value)
    return value


def duration_between(minimum: str, maximum: str) -> Checked:
    """The range a Duration field must lie in to be usable, inclusive: `Annotated[Duration,
    duration_between("1s", "1h")]`. A zero where the value divides or must be met (a
    stabilization window, a latency target) would be admitted and then break the operator;
    every Duration of the spec says its range this way, in CEL (Kubernetes' duration()) and in
    Python alike."""
    low, high = parse_duration(minimum), parse_duration(maximum)
    message = f"must be a duration from {minimum} to {maximum}"
    return Checked(
        (
            ValueRule(
                cel=f"duration(self) >= duration('{minimum}') && "
                f"duration(self) <= duration('{maximum}')",
                message=message,
                problem=lambda text: None if low <= parse_duration(text) <= high else message,
            ),
        )
    )


def _check_quantity(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("must be a Kubernetes quantity: an integer or a string such as 20Gi")
    parse_quantity(value)
    return value


Duration = Annotated[
    str,
    BeforeValidator(_check_duration),
    WithJsonSchema(
        {"type": "string", "pattern": DURATION_PATTERN, "maxLength": DURATION_MAX_LENGTH}
    ),
]
"""A duration in Kubernetes notation, e.g. "500ms", "30s", "5m"; spec fields add their range
with `duration_between`."""

Quantity = Annotated[
    int | str,
    BeforeValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes resource quantity, e.g. 8, "500m", "20Gi"."""

FreeFormObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""A Kubernetes object passed through verbatim (e.g. an Affinity), validated by the API server
where it lands (the pod template)."""

PortNumber = Annotated[int, Field(ge=1024, le=65535)]
DNSLabel = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
# A qualified resource name such as "nvidia.com/gpu" or "rdma/ib".
ResourceName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=253,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    ),
]
