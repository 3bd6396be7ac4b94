"""The simulated vLLM v1 engine: KV block pool, continuous-batching scheduler and step loop.

Where it fits: the HTTP layer (`server.py`) submits requests here and reads tokens back; the
simulated NIXL data plane (`sidechannel.py`) reads and releases the KV blocks a prefill
holds. Each step schedules like vLLM's v1 scheduler (running requests first, then waiting
ones FCFS, under a token budget with chunked prefill, `max_num_seqs` and free KV blocks;
recompute preemption when blocks run out) and lasts `PerfModel.step_seconds(...) *
time_scale` of wall time.

Times inside the engine are simulated seconds (wall seconds / time_scale). Steps are paced
against absolute deadlines, so sleep overshoot does not accumulate into the token rate.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pdfleet_worker.perfmodel import PerfModel
from pdfleet_worker.sim.kvparams import RemotePrefill, prefill_response_params
from pdfleet_worker.sim.metrics import (
    EngineMetrics,
    FinishedRequest,
    FirstToken,
    SchedulerState,
    Transfer,
)
from pdfleet_worker.sim.tokens import token_text

log = logging.getLogger("pdfleet.sim.engine")

# If the loop falls this far behind its deadlines (a busy CPU), restart pacing from now
# instead of replaying the missed steps back to back.
_MAX_CATCH_UP_WALL_S = 0.05

KvState = Literal["local", "pending", "transferring", "ready"]
# A decode request's async KV load by stage (vLLM's num_requests_kv_fetch_by_stage) while it
# waits: blocks not allocated yet, READ in flight, READ done but not scheduled yet.
_FETCH_STAGE: dict[str, str] = {
    "pending": "waiting_to_start",
    "transferring": "in_progress",
    "ready": "completed_waiting",
}


class PullError(Exception):
    """The KV could not be read: no handshake (side channel unreachable, wrong engine id,
    an incompatible prefill), data plane unreachable, or block ids the prefill engine does
    not have."""


class KvPuller(Protocol):
    """How a decode engine reaches a prefill engine (the simulated NIXL): a handshake over the
    prefill's side channel once per remote engine, then READs, their completion
    notifications and lease heartbeats over the prefill's data plane."""

    async def read(self, remote: RemotePrefill) -> None: ...
    async def notify(self, remote: RemotePrefill) -> None: ...
    async def heartbeat(self, remote: RemotePrefill, request_ids: list[str]) -> None: ...


@dataclass
class Token:
    index: int
    text: str
    final: bool = False  # a Finished event follows at once


@dataclass
class Finished:
    reason: str  # "length" | "stop" | "abort" | "error"
    prompt_tokens: int
    completion_tokens: int
    kv_transfer_params: dict[str, Any] | None = None


Event = Token | Finished


@dataclass
class Request:
    """One sequence in the engine (n=1)."""

    id: str
    prompt_tokens: int
    max_tokens: int
    # "length" when the client capped the output, "stop" when the simulated EOS ended it.
    limit_reason: str
    arrival: float
    remote: RemotePrefill | None = None
    hold_for_remote_decode: bool = False
    kv_state: KvState = "local"
    external_tokens: int = 0  # prompt tokens loaded from a prefill engine
    preemptions: int = 0
    computed: int = 0
    generated: int = 0
    blocks: list[int] = field(default_factory=list)
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    done: bool = False
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass
class Held:
    """Prefill KV kept for a remote decode until its READ's notification or the lease end."""

    blocks: list[int]
    num_tokens: int
    expires_at: float
    reading: bool = False  # a decode has started reading it (shown on the side channel)


@dataclass
class EngineConfig:
    model_name: str
    time_scale: float = 1.0
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    side_channel_host: str = "localhost"
    side_channel_port: int = 5600
    tp_size: int = 1
    kv_bandwidth_bytes_per_s: float = 50e9
    kv_load_failure_policy: str = "fail"
    kv_lease_s: float = 30.0
    max_model_len: int = 131072
    # The NIXL compatibility hash this engine's handshake answers with and a decode compares
    # (kvparams.compatibility_hash of the launch flags), and whether it compares
    # (kv_connector_extra_config.enforce_handshake_compat, vLLM's default true).
    compat_hash: str = ""
    enforce_handshake_compat: bool = True


@dataclass
class SimStats:
    """Counters that vLLM does not expose but tests need (served on /sim/stats)."""

    requests: int = 0
    prefill_requests: int = 0  # do_remote_decode requests (prefill half)
    kv_held: int = 0  # prefill results kept for a remote decode
    kv_served_reads: int = 0  # READs by a decode, of held blocks or not (prefill side)
    kv_released: int = 0  # held KV freed by its READ's notification
    kv_expired: int = 0
    kv_pulls: int = 0  # decode side: KV pulled from a prefill
    kv_pull_failures: int = 0  # decode side: valid params but no handshake or READ
    recompute_invalid_params: int = 0  # decode side: do_remote_prefill with bad params
    plain_requests: int = 0  # no kv_transfer_params at all
    rejected_draining: int = 0
    preemptions: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class BlockPool:
    """Fixed pool of KV block ids, handed out and returned like vLLM's free-block queue."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        return [self._free.popleft() for _ in range(n)]

    def release(self, blocks: list[int]) -> None:
        self._free.extend(blocks)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks if self.num_blocks else 0.0


@dataclass
class _Scheduled:
    req: Request
    chunk: int
    past: int


class Engine:
    def __init__(
        self,
        model: PerfModel,
        config: EngineConfig,
        metrics: EngineMetrics,
        puller: KvPuller | None = None,
        wall: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.model = model
        self.config = config
        self.metrics = metrics
        self.puller = puller
        self.stats = SimStats()
        self.pool = BlockPool(model.kv_capacity_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.held: dict[str, Held] = {}
        self.accepting = True
        self._wall = wall
        self._sleep = sleep
        self._t0 = wall()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        metrics.bind_gauges(self.scheduler_state)

    # ----- clock -------------------------------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since start."""
        return (self._wall() - self._t0) / self.config.time_scale

    def _wall_of(self, t: float) -> float:
        return self._t0 + t * self.config.time_scale

    def scheduler_state(self) -> SchedulerState:
        return SchedulerState(
            running=len(self.running),
            waiting_by_reason=collections.Counter(waiting_reason(r) for r in self.waiting),
            kv_fetch_by_stage=collections.Counter(
                _FETCH_STAGE[r.kv_state] for r in self.waiting if r.kv_state in _FETCH_STAGE
            ),
            kv_usage=self.pool.usage(),
        )

    # ----- admission ---------------------------------------------------------------------

    def validate(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request can never run here (vLLM answers 400), or None."""
        if prompt_tokens + max_tokens > self.config.max_model_len:
            return (
                f"This model's maximum context length is {self.config.max_model_len} tokens. "
                f"However, you requested {prompt_tokens + max_tokens} tokens "
                f"({prompt_tokens} in the messages, {max_tokens} in the completion)."
            )
        if self.model.blocks_for(prompt_tokens + max_tokens) > self.pool.num_blocks:
            return "request does not fit in the KV cache of this engine"
        return None

    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        limit_reason: str,
        remote: RemotePrefill | None = None,
        hold_for_remote_decode: bool = False,
    ) -> Request:
        req = Request(
            id=request_id,
            prompt_tokens=max(1, prompt_tokens),
            max_tokens=max(1, max_tokens),
            limit_reason=limit_reason,
            arrival=self.now(),
            remote=remote,
            hold_for_remote_decode=hold_for_remote_decode,
            kv_state="pending" if remote else "local",
        )
        self.stats.requests += 1
        self.waiting.append(req)
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        """Client went away: free everything the request holds."""
        if req.done:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req.kv_state != "transferring":  # the transfer task frees its own blocks
            self.pool.release(req.blocks)
            req.blocks = []
        self._finish(req, "abort", self.now(), keep_blocks=False)

    # ----- prefill side of the KV protocol (called by the data plane) ---------------------

    def nixl_read(self, request_id: str, block_ids: Sequence[int]) -> int:
        """A decode READs blocks of this engine. NIXL reads are one-sided: this engine's
        scheduler takes no part, so blocks are read whether or not `request_id` is still
        held (a stale id reads whatever the blocks hold now). Block ids outside the pool fail
        like an invalid NIXL descriptor."""
        bad = [b for b in block_ids if not 0 <= b < self.pool.num_blocks]
        if bad:
            raise PullError(f"block ids {bad} are not in this engine's {self.pool.num_blocks}")
        held = self.held.get(request_id)
        if held is not None:
            held.reading = True
        self.stats.kv_served_reads += 1
        return len(block_ids)

    def nixl_notify(self, request_id: str) -> bool:
        """The READ's completion notification: the held blocks are freed. One for a request
        no longer held (read already, expired, unknown) is counted as vLLM counts it."""
        held = self.held.pop(request_id, None)
        if held is None:
            self.metrics.nixl_after_expiry.inc()
            log.error(
                "Potentially invalid KV blocks for unrecognized request %s were retrieved by a "
                "decode worker. They may have expired.",
                request_id,
            )
            return False
        self.pool.release(held.blocks)
        self.stats.kv_released += 1
        self._wake.set()  # freed blocks may admit a waiting request
        return True

    def nixl_heartbeat(self, request_ids: list[str]) -> int:
        """A decode's "HB:" notification: extends the leases of the ids still held."""
        now = self.now()
        n = 0
        for rid in request_ids:
            held = self.held.get(rid)
            if held is not None:
                held.expires_at = max(held.expires_at, now + self.config.kv_lease_s)
                n += 1
        return n

    def expire_held(self) -> int:
        now = self.now()
        # Read or not: vLLM frees on expiry even while a READ may be in flight.
        gone = [rid for rid, h in self.held.items() if h.expires_at < now]
        for rid in gone:
            self.pool.release(self.held.pop(rid).blocks)
            self.stats.kv_expired += 1
            self.metrics.nixl_expired.inc()
            log.warning(
                "freed KV of %s: not read within the %ss lease", rid, self.config.kv_lease_s
            )
        if gone:
            self._wake.set()
        return len(gone)

    # ----- drain -------------------------------------------------------------------------

    def has_work(self) -> bool:
        """vLLM 0.33 Scheduler.has_requests(): includes KV still held for a remote decode."""
        return bool(self.waiting or self.running or self.held)

    def stop_accepting(self) -> None:
        self.accepting = False

    # ----- scheduling ----------------------------------------------------------------------

    def _grow(self, req: Request, tokens: int) -> bool:
        need = self.model.blocks_for(tokens) - len(req.blocks)
        if need <= 0:
            return True
        got = self.pool.allocate(need)
        if got is None:
            return False
        req.blocks.extend(got)
        return True

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        self.pool.release(victim.blocks)
        victim.blocks = []
        victim.computed = 0  # recompute mode: prompt and generated tokens are prefilled again
        victim.preemptions += 1
        if victim.kv_state == "ready":
            victim.kv_state = "local"  # the pulled KV is gone with its blocks
        self.waiting.appendleft(victim)
        self.stats.preemptions += 1
        self.metrics.preemptions.inc()

    def schedule(self) -> list[_Scheduled]:
        """One step's batch, allocating its KV blocks (vLLM v1 scheduler order)."""
        budget = self.model.max_num_batched_tokens
        batch: list[_Scheduled] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            chunk = min(req.total_tokens - req.computed, budget)
            if not self._grow(req, req.computed + chunk):
                # Out of blocks: preempt from the back of the running list (vLLM order),
                # which may be this request itself.
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                continue
            self._admit(req, batch, chunk)
            budget -= chunk
            i += 1
        if preempted:
            return batch
        for req in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.model.max_num_seqs:
                break
            if req.kv_state == "transferring":
                continue  # WAITING_FOR_REMOTE_KVS: skipped, does not block the queue
            if req.kv_state == "pending":
                if not self._grow(req, req.prompt_tokens):
                    break
                self._start_transfer(req)
                continue
            chunk = min(req.total_tokens - req.computed, budget)
            if not self._grow(req, req.computed + chunk):
                break
            self.waiting.remove(req)
            self.running.append(req)
            self._admit(req, batch, chunk)
            budget -= chunk
        return batch

    def _admit(self, req: Request, batch: list[_Scheduled], chunk: int) -> None:
        if req.first_scheduled is None:
            req.first_scheduled = self.now()
        batch.append(_Scheduled(req, chunk, req.computed))

    def step_seconds(self, batch: list[_Scheduled]) -> float:
        # One-token chunks (decode, or the last prompt token after a KV pull) cost a decode
        # slot with attention over their context; longer chunks are prefill.
        prefill = [(s.chunk, s.past) for s in batch if s.chunk > 1]
        decode = [s.past + 1 for s in batch if s.chunk == 1]
        mean_ctx = sum(decode) / len(decode) if decode else 0.0
        return self.model.step_seconds(prefill, len(decode), mean_ctx)

    def complete(self, batch: list[_Scheduled], t: float) -> None:
        """Apply a finished step at simulated time t: advance KV, emit tokens, finish."""
        new_tokens = 0
        for s in batch:
            req = s.req
            new_tokens += s.chunk
            if req.done:
                continue
            req.computed += s.chunk
            if req.computed < req.total_tokens:
                continue  # a prefill chunk that did not reach the end of the prompt
            self._emit(req, t)
        self.metrics.iteration_tokens.observe(new_tokens)

    def _emit(self, req: Request, t: float) -> None:
        index = req.generated
        req.generated += 1
        self.metrics.generation_tokens.inc()
        if req.first_token is None:
            req.first_token = t
            self.metrics.first_token(
                FirstToken(t - req.arrival, req.prompt_tokens, req.external_tokens, req.max_tokens)
            )
        elif req.last_token is not None:
            self.metrics.itl.observe(t - req.last_token)
        req.last_token = t
        final = req.generated >= req.max_tokens
        req.events.put_nowait(Token(index, token_text(index), final))
        if final:
            self.running.remove(req)
            self._finish(req, req.limit_reason, t, keep_blocks=req.hold_for_remote_decode)

    def _finish(self, req: Request, reason: str, t: float, keep_blocks: bool) -> None:
        req.done = True
        params: dict[str, Any] | None = None
        if keep_blocks and reason in ("length", "stop"):
            # The prefill half: keep the blocks for the decode worker to read.
            self.held[req.id] = Held(req.blocks, req.computed, t + self.config.kv_lease_s)
            self.stats.kv_held += 1
            params = prefill_response_params(
                block_ids=req.blocks,
                engine_id=self.config.engine_id,
                request_id=req.id,
                host=self.config.side_channel_host,
                port=self.config.side_channel_port,
                tp_size=self.config.tp_size,
                num_tokens=req.computed,
            )
        else:
            self.pool.release(req.blocks)
        req.blocks = []
        self.metrics.request_finished(finished_stats(req, reason, t))
        req.events.put_nowait(Finished(reason, req.prompt_tokens, req.generated, params))

    # ----- decode side of the KV protocol --------------------------------------------------

    def _start_transfer(self, req: Request) -> None:
        req.kv_state = "transferring"
        task = asyncio.get_running_loop().create_task(self._transfer(req))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _transfer(self, req: Request) -> None:
        remote = req.remote
        assert remote is not None
        started = self.now()
        ok = False
        try:
            if self.puller is None:
                raise PullError("no KV puller configured")
            await self.puller.read(remote)
            posted = self.now()
            # vLLM's pull decode loads every prompt token (the prompt is its own, so
            # remote_num_tokens is not consulted); the time is the model's, not measured.
            tokens = req.prompt_tokens
            seconds = self.model.kv_transfer_seconds(tokens, self.config.kv_bandwidth_bytes_per_s)
            await self._sleep(seconds * self.config.time_scale)
            await self.puller.notify(remote)
            ok = True
            blocks = min(len(remote.block_ids), self.model.blocks_for(tokens))
            self.metrics.kv_transfer(
                Transfer(
                    post_s=posted - started,
                    xfer_s=seconds,  # the modelled READ; the notification rides along
                    # NIXL moves whole blocks; one descriptor per block (vLLM: per block and
                    # per layer region, which the latency model does not know).
                    num_bytes=blocks * self.model.block_size * self.model.kv_bytes_per_token,
                    descriptors=blocks,
                )
            )
        except PullError as err:
            log.warning("KV load failed for %s: %s", req.id, err)
        if req.done:  # aborted while transferring
            self.pool.release(req.blocks)
            req.blocks = []
            return
        if ok:
            self.stats.kv_pulls += 1
            req.kv_state = "ready"
            req.external_tokens = req.prompt_tokens
            # vLLM recomputes the last prompt token locally to get its logits.
            req.computed = req.prompt_tokens - 1
        else:
            self.stats.kv_pull_failures += 1
            self.metrics.nixl_failed.inc()
            if self.config.kv_load_failure_policy == "recompute":
                req.kv_state = "local"
                req.computed = 0
            else:
                self.waiting.remove(req)
                self._finish(req, "error", self.now(), keep_blocks=False)
        self._wake.set()

    async def _heartbeats(self) -> None:
        """Keep the prefill leases of requests queued here alive (every lease / 6), one
        heartbeat per remote engine, as vLLM's decode does for params with a tp_size."""
        interval = self.config.kv_lease_s / 6 * self.config.time_scale
        while True:
            await self._sleep(interval)
            if self.puller is None:
                continue
            for remote, ids in heartbeat_batches(self.waiting).values():
                with contextlib.suppress(PullError):
                    await self.puller.heartbeat(remote, ids)

    # ----- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Step forever; idle until a request arrives, a transfer ends or a lease expires."""
        hb = asyncio.get_running_loop().create_task(self._heartbeats())
        self._tasks.add(hb)
        sweep_wall = min(1.0, self.config.kv_lease_s * self.config.time_scale / 10)
        deadline: float | None = None
        try:
            while True:
                self.expire_held()
                batch = self.schedule()
                if not batch:
                    deadline = None
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=sweep_wall)
                    continue
                now = self._wall()
                start = (
                    now if deadline is None or now - deadline > _MAX_CATCH_UP_WALL_S else deadline
                )
                deadline = start + self.step_seconds(batch) * self.config.time_scale
                await self._sleep(max(0.0, deadline - self._wall()))
                self.complete(batch, (deadline - self._t0) / self.config.time_scale)
        finally:
            for task in list(self._tasks):
                task.cancel()


def waiting_reason(req: Request) -> str:
    """vLLM's reason label of a waiting request: one whose KV is being pulled, or pulled and
    not scheduled yet, is deferred (WAITING_FOR_REMOTE_KVS); any other waits for capacity."""
    return "deferred" if req.kv_state in ("transferring", "ready") else "capacity"


def heartbeat_batches(
    waiting: Sequence[Request],
) -> dict[str, tuple[RemotePrefill, list[str]]]:
    """Remote request ids to heartbeat, by remote engine id (with one of its params to reach
    it): the waiting requests whose KV is still to be read."""
    out: dict[str, tuple[RemotePrefill, list[str]]] = {}
    for req in waiting:
        remote = req.remote
        if remote is not None and remote.heartbeat and req.kv_state in ("pending", "transferring"):
            out.setdefault(remote.engine_id, (remote, []))[1].append(remote.request_id)
    return out


def finished_stats(req: Request, reason: str, t: float) -> FinishedRequest:
    """What a request finishing at simulated time t adds to the histograms. A phase the
    request never reached lasts 0 (vLLM records those requests too)."""
    scheduled = t if req.first_scheduled is None else req.first_scheduled
    first = t if req.first_token is None else req.first_token
    decode_steps = req.generated - 1
    return FinishedRequest(
        reason=reason,
        e2e=t - req.arrival,
        queued=scheduled - req.arrival,
        prefill=first - scheduled,
        inference=t - scheduled,
        decode=t - first,
        prompt_tokens=req.prompt_tokens,
        generation_tokens=req.generated,
        max_tokens=req.max_tokens,
        preemptions=req.preemptions,
        mean_time_per_output_token=(t - first) / decode_steps if decode_steps > 0 else 0.0,
    )
