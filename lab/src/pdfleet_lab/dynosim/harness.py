"""The DynoSim benchmark: pdfleet's policy, fixed splits and the clairvoyant bound, per workload.

Where it fits: `make bench-autoscale-dynosim` runs `python -m pdfleet_lab.dynosim` in
DynoSim's venv (`lab/dynosim/setup.sh`). For each workload (W1-W3 of shared/traces/workloads)
it replays, in DynoSim: pdfleet's policy with a capacity hint (priors from the timing table,
as `bench.capacity_priors` derives them from the perf model) and without (priors None); the
fixed P:D splits that can matter (`oracle.staircase`) and the cheapest reaching 95 %; and the
clairvoyant bound (`oracle.clairvoyant` over 5-minute windows, each window's splits replayed
alone in DynoSim). Settings are `bench`'s: start-up 120 s, interval 15 s, GPU budget 12,
initial 2P1D, the per-workload SLOs of `bench.WORKLOAD_SLOS`, the policy's
configuration from `bench.policy_config` with the priors swapped.

Replays run in `runtime serve` processes, one per core, each behind a thread here; a replay
that does not answer within its wall cap is killed and counts as failed (attainment 0 for a
split). Writes `results.md` and `<workload>.json` into `--out`.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from pdfleet_lab import bench, heldout, oracle
from pdfleet_lab.dynosim import results
from pdfleet_lab.dynosim import table as tables
from pdfleet_lab.dynosim.results import PROGRESS_PREFIX, RESULT_PREFIX
from pdfleet_lab.sim import SimConfig
from pdfleet_lab.traces import Workload, load, to_mooncake

T = TypeVar("T")
WINDOW_S = 300.0
# A replay whose simulated clock does not reach its next tick (60 s simulated for a fixed
# split, 15 s for a policy run) within this much wall time has stalled.
STALL_S = 45.0
BLOCK_SIZE = 512  # the traces' hash ids are per 512-token block


@dataclass(frozen=True)
class Settings:
    table: str
    budget: int = 12
    startup_s: float = 120.0
    interval_s: float = 15.0
    scrape_interval_s: float = 15.0
    window_s: float = 60.0
    percentile: float = 95.0
    initial: tuple[int, int] = bench.INITIAL_FLEET
    kv_bandwidth_gbps: float = 50.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    preset: str = "llama-3.1-8b-h200"
    # wall caps: seconds + seconds per 1,000 requests (policy runs read signals every tick)
    cap_base_s: float = 20.0
    cap_per_kreq_s: float = 1.0
    policy_cap_per_kreq_s: float = 3.0
    # a fixed split stops as failed once a tick's mean TTFT passes the larger of these
    abort_ttft_s: float = 60.0
    abort_ttft_slos: float = 30.0


def sim_config(s: Settings) -> SimConfig:
    from pdfleet_worker.perfmodel import preset

    return SimConfig(
        perf=preset(s.preset),
        startup_s=s.startup_s,
        interval_s=s.interval_s,
        cluster_gpus=s.budget,
        percentile=s.percentile,
    )


def kv_blocks(sim: SimConfig) -> int:
    """The perf preset's KV capacity (the same engines as FleetSim's) in DynoSim's blocks."""
    return sim.perf.kv_capacity_tokens // BLOCK_SIZE


def base_spec(s: Settings, sim: SimConfig, ttft: float, itl: float) -> dict[str, Any]:
    return {
        "table": s.table,
        "ttft_s": ttft,
        "itl_s": itl,
        "startup_s": s.startup_s,
        "kv_blocks": kv_blocks(sim),
        "block_size": BLOCK_SIZE,
        "kv_bandwidth_gbps": s.kv_bandwidth_gbps,
        "kv_bytes_per_token": sim.perf.kv_bytes_per_token,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "interval_s": s.interval_s,
        "scrape_interval_s": s.scrape_interval_s,
        "window_s": s.window_s,
        "percentile": s.percentile,
        "policy": None,
    }


def wall_cap(s: Settings, requests: int, policy: bool) -> float:
    per = s.policy_cap_per_kreq_s if policy else s.cap_per_kreq_s
    return s.cap_base_s + per * requests / 1000.0


# --- trace files -----------------------------------------------------------------------


def read_records(path: Path) -> list[dict[str, Any]]:
    """The Mooncake records of a trace file, by timestamp."""
    import gzip

    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    recs = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    return sorted(recs, key=lambda r: float(r["timestamp"]))


def window_records(
    records: Sequence[dict[str, Any]], start_s: float, end_s: float
) -> list[dict[str, Any]]:
    """The records arriving in [start_s, end_s), re-based to start at 0 (as
    `Workload.window` does)."""
    lo, hi = start_s * 1000.0, end_s * 1000.0
    return [
        {**r, "timestamp": float(r["timestamp"]) - lo}
        for r in records
        if lo <= float(r["timestamp"]) < hi
    ]


def write_jsonl(records: Sequence[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def trace_file(spec: str, workloads_dir: Path, work: Path) -> Path:
    """A shared workload's file (W1...), or a held-out one (H1...) built from the Azure
    traces beside the shared workloads and written into `work` as Mooncake records."""
    if spec not in heldout.BUILDERS:
        return bench._resolve(spec, workloads_dir)
    wl = heldout.build(spec, workloads_dir.parent / "azure")
    return write_jsonl(list(to_mooncake(wl)), work / "heldout" / f"{wl.name}.jsonl")


# --- replay processes ------------------------------------------------------------------


class Server:
    """One `runtime serve` process; restarted after a kill."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        return subprocess.Popen(
            [sys.executable, "-m", "pdfleet_lab.dynosim.runtime", "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def run(self, spec: dict[str, Any], cap_s: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({**spec, "wall_cap_s": cap_s}) + "\n")
        proc.stdin.flush()
        start = time.monotonic()
        deadline = start + cap_s + 30.0  # the run checks its cap at each tick
        stalled_at = start + STALL_S + 30.0  # the first tick comes after DynoSim's set-up
        while True:
            wait = max(min(deadline, stalled_at) - time.monotonic(), 0.0)
            ready, _, _ = select.select([proc.stdout], [], [], wait)
            if not ready:
                self.kill()
                if time.monotonic() >= deadline:
                    return {"error": f"killed: no answer within {cap_s + 30:.0f} s of wall time"}
                return {"error": f"killed: stalled (no tick for {STALL_S:.0f} s of wall time)"}
            line = proc.stdout.readline()
            if not line:
                self.kill()
                return {"error": "the replay process died"}
            if line.startswith(PROGRESS_PREFIX):
                stalled_at = time.monotonic() + STALL_S
            elif line.startswith(RESULT_PREFIX):
                answer: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
                return answer


_local = threading.local()
_servers: list[Server] = []
_lock = threading.Lock()


def server() -> Server:
    if not hasattr(_local, "server"):
        _local.server = Server()
        with _lock:
            _servers.append(_local.server)
    srv: Server = _local.server
    return srv


def policy_fingerprint() -> str:
    """A hash of the code a policy run executes on top of DynoSim: the policy, its queries
    and metrics source, the lab's signal path and the worker's (histogram buckets, perf
    presets). A policy run's answer is remembered under it, so a changed policy is
    replayed, never answered from an older run."""
    import pdfleet.autoscale
    import pdfleet_lab
    import pdfleet_worker

    packages = (
        Path(pdfleet.autoscale.__file__).parent,
        Path(pdfleet_lab.__file__).parent,
        Path(pdfleet_worker.__file__).parent,
    )
    digest = hashlib.sha256()
    for root in packages:
        for path in sorted(root.rglob("*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached_run(work: Path, spec: dict[str, Any], cap_s: float) -> dict[str, Any]:
    """`Server.run` on this thread's server, remembered in `work` by the spec (the trace
    files there are rewritten identically), so a rerun skips finished replays."""
    key = hashlib.sha256(json.dumps({**spec, "cap": cap_s}, sort_keys=True).encode()).hexdigest()
    path = work / "answers" / f"{key[:32]}.json"
    if path.exists():
        answer: dict[str, Any] = json.loads(path.read_text())
        return answer
    answer = server().run(spec, cap_s)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(answer))
    return answer


def _bound_json(cv: oracle.Clairvoyant) -> dict[str, Any]:
    return {
        "gpu_hours": cv.gpu_hours,
        "attainment": cv.attainment,
        "window_s": WINDOW_S,
        "plan": [list(p) for p in cv.plan],
    }


def split_runner(
    s: Settings,
    base: dict[str, Any],
    files: dict[str, Path],
    log: list[dict[str, Any]],
    work: Path,
) -> oracle.Runner:
    """`oracle.Runner` on DynoSim: a fixed split of a workload (by name, from `files`)."""

    def run(wl: Workload, p: int, d: int) -> oracle.SplitResult:
        spec = {
            **base,
            "trace": str(files[wl.name]),
            "prefill": p,
            "decode": d,
            "abort_ttft_s": max(s.abort_ttft_s, s.abort_ttft_slos * base["ttft_s"]),
        }
        answer = cached_run(work, spec, wall_cap(s, len(wl), policy=False))
        if "error" in answer:
            att, gpu_h = 0.0, (p + d) * wl.duration_s / 3600.0
        else:
            att = results.attainment(answer["report"], len(wl))
            gpu_h = float(answer["report"]["gpu_hours"])
        log.append(
            {
                "trace": wl.name,
                "prefill": p,
                "decode": d,
                "attainment": att,
                "gpu_hours": gpu_h,
                **({"failed": answer["error"]} if "error" in answer else {}),
            }
        )
        print(f"    {wl.name} {p}P{d}D {att:.2%} {gpu_h:.2f} GPU-h", flush=True)
        return oracle.SplitResult(p, d, att, gpu_h, len(wl))

    return run


class Queue:
    """Jobs of all workloads, started in priority order (the policy runs first, then the
    fixed splits, then the clairvoyant windows), so a cut-short run still has the rows that
    matter most."""

    def __init__(self) -> None:
        self.jobs: list[tuple[int, int, Callable[[], Any], Future[Any]]] = []

    def add(self, priority: int, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        self.jobs.append((priority, len(self.jobs), fn, fut))
        return fut

    def start(self, pool: ThreadPoolExecutor) -> None:
        def relay(fn: Callable[[], Any], fut: Future[Any]) -> None:
            try:
                fut.set_result(fn())
            except BaseException as error:
                fut.set_exception(error)

        for _, _, fn, fut in sorted(self.jobs, key=lambda j: (j[0], j[1])):
            pool.submit(relay, fn, fut)


def bench_workload(
    trace: Path, queue: Queue, s: Settings, work: Path, timing: tables.TimingTable
) -> Callable[[], dict[str, Any]]:
    """Queue the workload's replays; the function returned waits for them (call it from
    outside the pool) and assembles the workload's result."""
    wl = load(trace)
    short = wl.name.split("_")[0]
    ttft, itl = bench.WORKLOAD_SLOS.get(short, (1.0, 0.015))
    sim = sim_config(s)
    base = base_spec(s, sim, ttft, itl)
    records = read_records(trace)
    files = {wl.name: write_jsonl(records, work / f"{wl.name}.jsonl")}
    pcfg = bench.policy_config(sim, ttft, itl, s.budget)
    prior_p, prior_d = tables.capacity_priors(
        timing, ttft, itl, sim.perf.kv_capacity_tokens, s.max_num_seqs, s.max_num_batched_tokens
    )
    configs = {
        "pdfleet": replace(pcfg, prefill_capacity_prior=prior_p, decode_capacity_prior=prior_d),
        "pdfleet-learned": replace(pcfg, prefill_capacity_prior=None, decode_capacity_prior=None),
    }
    flap_window = pcfg.scale_down_stabilization_s
    code = policy_fingerprint()

    def policy_run(name: str) -> dict[str, Any]:
        spec = {
            **base,
            "trace": str(files[wl.name]),
            "prefill": s.initial[0],
            "decode": s.initial[1],
            "policy": asdict(configs[name]),
            "code": code,
        }
        answer = cached_run(work, spec, wall_cap(s, len(wl), policy=True))
        row = results.summarize(name, answer, len(wl), flap_window)
        row["timeline"] = answer.get("timeline", [])
        row["scale_event_list"] = answer.get("scale_events", [])
        brief = {k: v for k, v in row.items() if k not in ("timeline", "scale_event_list")}
        print(f"  {wl.name} {name}: {json.dumps(brief)}", flush=True)
        return row

    split_log: list[dict[str, Any]] = []
    run = split_runner(s, base, files, split_log, work)
    windows: list[tuple[float, Workload]] = []
    t = 0.0
    while t <= wl.duration_s:
        part = wl.window(t, t + WINDOW_S)
        if len(part):
            files[part.name] = write_jsonl(
                window_records(records, t, t + WINDOW_S), work / f"{wl.name}-w{int(t)}.jsonl"
            )
            windows.append((t, part))
        t += WINDOW_S
    policy_futs = {name: queue.add(0, partial(policy_run, name)) for name in configs}
    fixed_fut = queue.add(1, partial(oracle.fixed_splits, wl, run, s.budget))
    window_futs = [
        (t, part, queue.add(2, partial(oracle.staircase, part, run, s.budget)))
        for t, part in windows
    ]

    def collect() -> dict[str, Any]:
        splits = fixed_fut.result()
        cheapest = oracle.cheapest_reaching(splits, bench.TARGET)
        fronts: oracle.Fronts = [(t, part, oracle.hull(f.result())) for t, part, f in window_futs]
        bound = partial(
            oracle.clairvoyant, wl, replace(sim, startup_s=0.0), ttft, itl, s.budget, bench.TARGET
        )
        cv = bound(fronts=fronts)
        # one more replay at most: the initial split is usually on the first window's front
        first = run(windows[0][1], *s.initial)
        from_initial = bound(fronts=oracle.first_window_at(fronts, first))
        every_window = bound(fronts=fronts, every_window=True)
        out: dict[str, Any] = {
            "workload": wl.name,
            "requests": len(wl),
            "duration_s": wl.duration_s,
            "slo": {"ttft_s": ttft, "itl_s": itl, "attainment_target": bench.TARGET},
            "settings": {**asdict(s), "kv_blocks": kv_blocks(sim), "block_size": BLOCK_SIZE},
            "capacity_priors": {"prefill_tokens_s": prior_p, "decode_tokens_s": prior_d},
            "policy_config": asdict(configs["pdfleet"]),
            "runs": {name: f.result() for name, f in policy_futs.items()},
            "fixed": [asdict(r) for r in splits],
            "cheapest_fixed": asdict(cheapest) if cheapest else None,
            "clairvoyant": _bound_json(cv),
            "clairvoyant_from_initial": _bound_json(from_initial),
            "clairvoyant_every_window": _bound_json(every_window),
            # replays finish in whatever order the queue ran them; sorted, a rerun diffs clean
            "split_runs": sorted(split_log, key=lambda r: (r["trace"], r["prefill"], r["decode"])),
        }
        refs = bench.references(out)
        out["ratios"] = {name: bench.ratios(run, refs) for name, run in out["runs"].items()}
        return out

    return collect
