"""The planner hook DynoSim calls once per tick, running a pdfleet_lab controller.

Where it fits: `runtime.run` hands a `Ticker` to DynoSim's `PlannerReplayBridge.run`, which
owns the replay loop and calls `initial_tick_ms()` once and `on_tick(metrics)` at every tick
time the ticker asks for (the protocol `dynamo.planner.offline.replay_adapter` implements for
Dynamo's own planner; this is a separate implementation of the same two methods). Every
`scrape_interval_s` the ticker feeds the tick to `signals.FleetSignals` (which scrapes every
engine); every `interval_s` it reads the window through the operator's PromQL and asks the
controller, with replica counts from DynoSim's fleet (`total_*` = current, `active_*` =
ready), for the desired (prefill, decode), which DynoSim applies (new workers are ready after
its start-up time; removed ones drain). A ticker without a controller (a fixed split) only
ticks every `DRAIN_S`, reading nothing: DynoSim buffers every forward pass's snapshot until
the next tick, and a replay without ticks grows by gigabytes. Pure: no dynamo import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdfleet.autoscale.policy import RoleMetrics, RoleReplicas
from pdfleet_lab.dynosim.signals import FleetSignals
from pdfleet_lab.sim import Controller

DRAIN_S = 60.0  # tick period of a fixed split: only to drain the snapshot buffers


def replicas(tick: Mapping[str, Any], role: str) -> RoleReplicas:
    return RoleReplicas(
        current=int(tick[f"total_{role}_count"]), ready=int(tick[f"active_{role}_count"])
    )


@dataclass
class Ticker:
    signals: FleetSignals
    controller: Controller | None = None
    interval_s: float = 15.0
    scrape_interval_s: float = 15.0
    ticks: int = 0
    last_control_s: float = -math.inf
    timeline: list[dict[str, float]] = field(default_factory=list)
    scale_events: list[tuple[float, str, int, int]] = field(default_factory=list)

    def initial_tick_ms(self) -> float:
        return (DRAIN_S if self.controller is None else self.scrape_interval_s) * 1000.0

    def on_tick(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        now = float(metrics["now_ms"]) / 1000.0
        self.ticks += 1
        if self.controller is None:
            nxt = (now + DRAIN_S) * 1000.0
            return {"target_prefill": None, "target_decode": None, "next_tick_ms": nxt}
        self.signals.observe(now, metrics)
        target: dict[str, int | None] = {"prefill": None, "decode": None}
        if now - self.last_control_s >= self.interval_s - 1e-6:
            self.last_control_s = now
            p, d = replicas(metrics, "prefill"), replicas(metrics, "decode")
            window = self.signals.window(now)
            want = self.controller(now, p, d, window)
            for role, cur, new in (("prefill", p, want[0]), ("decode", d, want[1])):
                if new != cur.current:
                    target[role] = new
                    self.scale_events.append((now, role, cur.current, new))
            self._record(now, p, d, window.prefill, window.decode)
        return {
            "target_prefill": target["prefill"],
            "target_decode": target["decode"],
            "next_tick_ms": (now + self.scrape_interval_s) * 1000.0,
        }

    def _record(
        self,
        now: float,
        p: RoleReplicas,
        d: RoleReplicas,
        pm: RoleMetrics | None,
        dm: RoleMetrics | None,
    ) -> None:
        nan = math.nan
        self.timeline.append(
            {
                "t": now,
                "prefill": p.current,
                "decode": d.current,
                "prefill_ready": p.ready,
                "decode_ready": d.ready,
                "req_rate": pm.request_rate if pm else nan,
                "prompt_tps": pm.prompt_tokens_rate if pm else nan,
                "gen_tps": dm.generation_tokens_rate if dm else nan,
                "ttft_prefill": pm.ttft_s if pm else nan,
                "ttft_decode": dm.ttft_s if dm else nan,
                "itl": dm.itl_s if dm else nan,
                "tpot": dm.tpot_s if dm else nan,
                "prefill_waiting": pm.num_requests_waiting if pm else nan,
            }
        )
