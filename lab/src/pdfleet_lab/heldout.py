"""Held-out workloads: shapes and seeds the policy was never tuned on, built from the Azure traces.

Where it fits: `make bench-autoscale-heldout` runs `python -m pdfleet_lab.bench H1 ... H9`;
`bench.workload` builds each one here from `../shared/traces/azure/` (the sources of the
shared W1-W3) with `traces.overlay` and `traces.poisson`, the recipes of
`../shared/traces/workloads/README.md`; DynoSim (`make bench-autoscale-heldout-dynosim`)
gets the same requests as a trace file (`dynosim.harness.trace_file`). They check that the
policy's mechanisms, tuned against W1-W3 and S1, carry over to other bursts, ramps, steps
and shifts; nothing here is used to choose a constant. H6-H9 were added later to probe
shapes H1-H5 do not have (spikes recurring every 15 minutes, a prompt mix that flips back,
a load one replica carries, a heavier overlay). Each name's first two characters
key its SLO, as W1-W3's do.

P1 is not held out: a probe built to show one failure (`make bench-autoscale-probes`), a
share of long-context prompts whose own prefill time is over the TTFT target.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdfleet_lab.traces import Workload, load, overlay, poisson

HOUR_S = 3600.0


@dataclass(frozen=True)
class Sources:
    """The Azure LLM inference traces 2023: conversation and code."""

    conv: Workload
    code: Workload


def _hour(
    name: str, seed: int, rate_at: Callable[[float], float], sizes_at: Callable[[float], Workload]
) -> Workload:
    """An hour of Poisson arrivals at `rate_at(t)` requests/s, sizes from `sizes_at(t)`."""
    return poisson(rate_at, sizes_at, HOUR_S, name=name, seed=seed)


def _conv_x6(src: Sources) -> Workload:
    return overlay(src.conv, copies=6, seed=11, name="H1_conv_x6ov")


def _code_x3(src: Sources) -> Workload:
    return overlay(src.code, copies=3, seed=12, name="H2_code_x3ov")


def _shift_back(src: Sources) -> Workload:
    # W3 the other way round: code's long prompts first, then conversation's
    return _hour(
        "H3_shift_back", 13, lambda t: 40.0, lambda t: src.code if t < HOUR_S / 2 else src.conv
    )


def _ramp(src: Sources) -> Workload:
    # a day's rise and fall in an hour: 10 -> 60 -> 10 requests/s
    return _hour(
        "H4_conv_ramp",
        14,
        lambda t: 10.0 + 50.0 * math.sin(math.pi * t / HOUR_S) ** 2,
        lambda t: src.conv,
    )


def _step_down_up(src: Sources) -> Workload:
    # S1 the other way round: a lull of a tenth of the load, then the load back at once
    return _hour(
        "H5_step_down_up", 15, lambda t: 3.0 if 1200.0 <= t < 2400.0 else 30.0, lambda t: src.conv
    )


def _spikes(src: Sources) -> Workload:
    # a one-minute spike of six times the load every 15 minutes: bursts shorter than a
    # start-up that recur less often than the burst memory's half-life
    return _hour(
        "H6_spikes", 36, lambda t: 60.0 if 600.0 <= t % 900.0 < 660.0 else 10.0, lambda t: src.conv
    )


def _mix_flip(src: Sources) -> Workload:
    # one request rate, the prompt mix flipping between conversation and code every 10 minutes
    return _hour(
        "H7_mix_flip", 38, lambda t: 25.0, lambda t: src.code if int(t // 600.0) % 2 else src.conv
    )


def _light_square(src: Sources) -> Workload:
    # a load one prefill replica carries, alternating 30 and 3 requests/s every 5 minutes
    return _hour(
        "H8_light_square",
        32,
        lambda t: 30.0 if int(t // 300.0) % 2 == 0 else 3.0,
        lambda t: src.conv,
    )


def _conv_x10(src: Sources) -> Workload:
    return overlay(src.conv, copies=10, seed=35, name="H9_conv_x10ov")


LONG_CONTEXT_TOKENS = 24_000


def _long_context(src: Sources) -> Workload:
    # conversation at 12 requests/s, every eighth request with 24,000 tokens of retrieved
    # context in front of its prompt: under W2's 0.5 s TTFT target those prompts miss on
    # their own prefill time however many replicas there are
    with_context = Workload(
        name="conv_with_context",
        arrival_s=src.conv.arrival_s,
        input_tokens=tuple(
            n + (LONG_CONTEXT_TOKENS if i % 8 == 0 else 0)
            for i, n in enumerate(src.conv.input_tokens)
        ),
        output_tokens=src.conv.output_tokens,
    )
    return _hour("P1_long_context", 41, lambda t: 12.0, lambda t: with_context)


BUILDERS: dict[str, Callable[[Sources], Workload]] = {
    "H1": _conv_x6,
    "H2": _code_x3,
    "H3": _shift_back,
    "H4": _ramp,
    "H5": _step_down_up,
    "H6": _spikes,
    "H7": _mix_flip,
    "H8": _light_square,
    "H9": _conv_x10,
    "P1": _long_context,
}
# (TTFT s, mean ITL s): code's long prompts and P1 get W2's tighter TTFT, the others W1's
SLOS = {
    "H1": (1.0, 0.015),
    "H2": (0.5, 0.015),
    "H3": (1.0, 0.015),
    "H4": (1.0, 0.015),
    "H5": (1.0, 0.015),
    "H6": (1.0, 0.015),
    "H7": (1.0, 0.015),
    "H8": (1.0, 0.015),
    "H9": (1.0, 0.015),
    "P1": (0.5, 0.015),
}


@functools.cache  # one parse of the CSVs for all five workloads
def sources(azure_dir: Path) -> Sources:
    return Sources(
        conv=load(azure_dir / "AzureLLMInferenceTrace_conv.csv"),
        code=load(azure_dir / "AzureLLMInferenceTrace_code.csv"),
    )


def build(name: str, azure_dir: Path) -> Workload:
    """The held-out workload `name` (H1...H9), from the traces in `azure_dir`."""
    return BUILDERS[name](sources(azure_dir))
