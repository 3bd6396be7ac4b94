"""The simulated engine's scheduler, stepped by hand on a fake clock.

Continuous batching, queueing at `max_num_seqs` and at the KV block capacity, recompute
preemption, the batched decode step time `d0 + d1*B + d2*B*ctx` and the waiting gauges of a
decode pulling KV, all read from the engine's own accounting (its requests, counters and
histograms): no wall-clock timing, so a loaded machine cannot move a figure.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from pdfleet_worker.perfmodel import preset
from pdfleet_worker.sim.engine import Engine, EngineConfig, Request
from pdfleet_worker.sim.kvparams import RemotePrefill
from pdfleet_worker.sim.metrics import EngineMetrics

PRESET = "llama-3.1-8b-h200"
MODEL = preset(PRESET)
LABELS = {"model_name": "m", "engine": "0"}


class Clock:
    """The engine's wall clock, moved only by `drive` (time scale 1: wall = simulated)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_engine(**model: Any) -> tuple[Engine, Clock]:
    clock = Clock()
    engine = Engine(
        dataclasses.replace(MODEL, **model), EngineConfig("m"), EngineMetrics("m"), wall=clock
    )
    return engine, clock


def drive(engine: Engine, clock: Clock, steps: int | None = None) -> int:
    """Run steps as `Engine.run` paces them, without sleeping: schedule, let the step's model
    time pass, complete. Stops when idle or after `steps`; returns how many ran."""
    done = 0
    while steps is None or done < steps:
        batch = engine.schedule()
        if not batch:
            break
        clock.t += engine.step_seconds(batch)
        engine.complete(batch, engine.now())
        done += 1
    return done


def sample(engine: Engine, name: str, **labels: str) -> float:
    value = engine.metrics.registry.get_sample_value(name, {**LABELS, **labels})
    assert value is not None, name
    return value


def submit(engine: Engine, n: int, prompt: int, max_tokens: int) -> list[Request]:
    return [engine.submit(f"r{i}", prompt, max_tokens, "length") for i in range(n)]


def ttft(req: Request) -> float:
    assert req.first_token is not None
    return req.first_token - req.arrival


def test_requests_over_max_num_seqs_wait_and_their_ttft_includes_the_wait() -> None:
    engine, clock = make_engine(max_num_seqs=4)
    reqs = submit(engine, 6, prompt=100, max_tokens=10)
    drive(engine, clock, steps=1)
    assert sample(engine, "vllm:num_requests_running") == 4
    assert sample(engine, "vllm:num_requests_waiting") == 2
    drive(engine, clock)
    assert [r.generated for r in reqs] == [10] * 6
    assert sample(engine, "vllm:num_requests_waiting") == 0
    # The first four: one prefill step, then nine decode steps of batch 4; the last two wait
    # for them to finish, then prefill together.
    prefill_4 = MODEL.step_seconds([(100, 0)] * 4, 0, 0.0)
    first_done = prefill_4 + sum(MODEL.step_seconds([], 4, 100 + k) for k in range(1, 10))
    queued_ttft = first_done + MODEL.step_seconds([(100, 0)] * 2, 0, 0.0)
    assert [ttft(r) for r in reqs] == pytest.approx([prefill_4] * 4 + [queued_ttft] * 2)
    assert sample(engine, "vllm:time_to_first_token_seconds_sum") == pytest.approx(
        4 * prefill_4 + 2 * queued_ttft
    )
    assert sample(engine, "vllm:request_queue_time_seconds_sum") == pytest.approx(2 * first_done)


def test_a_full_kv_cache_queues_requests_that_fit_the_batch() -> None:
    # 20 blocks of 16 tokens (--num-gpu-blocks-override 20): a 100-token prompt takes 7.
    engine, clock = make_engine(kv_capacity_tokens=20 * 16)
    reqs = submit(engine, 3, prompt=100, max_tokens=4)
    drive(engine, clock, steps=1)
    assert sample(engine, "vllm:num_requests_running") == 2  # max_num_seqs is 256
    assert sample(engine, "vllm:num_requests_waiting") == 1
    assert sample(engine, "vllm:kv_cache_usage_perc") == pytest.approx(14 / 20)
    drive(engine, clock)
    prefill_2 = MODEL.step_seconds([(100, 0)] * 2, 0, 0.0)
    first_done = prefill_2 + sum(MODEL.step_seconds([], 2, 100 + k) for k in range(1, 4))
    assert ttft(reqs[2]) == pytest.approx(first_done + MODEL.step_seconds([(100, 0)], 0, 0.0))
    assert sample(engine, "vllm:num_preemptions_total") == 0
    assert engine.pool.free == 20


def test_running_out_of_kv_preempts_the_last_request_which_recomputes() -> None:
    # 16 blocks; two requests growing to 160 tokens need 10 each: the second must yield.
    engine, clock = make_engine(kv_capacity_tokens=16 * 16)
    first, second = submit(engine, 2, prompt=100, max_tokens=60)
    steps = 0
    while sample(engine, "vllm:num_preemptions_total") == 0:
        lost = second.computed  # the KV it holds when the step that preempts it starts
        steps += drive(engine, clock, steps=1)
        assert steps < 100, "no preemption"
    # Both held 8 blocks (128 tokens computed, the pool empty) when the first needed a 9th to
    # compute its 129th token: the second yielded, the first went on to its 30th output token.
    assert (first.generated, second.generated, lost) == (30, 29, 128)
    # Recompute mode: back to the front of the queue with nothing computed, blocks freed.
    assert list(engine.waiting) == [second] and second.computed == 0 and not second.blocks
    assert sample(engine, "vllm:num_requests_waiting") == 1
    first_ttft = ttft(second)
    drive(engine, clock)
    assert (first.generated, second.generated) == (60, 60)
    assert engine.stats.preemptions == 1 and ttft(second) == first_ttft
    # Each request computes its prompt and 59 generated tokens once; the preempted one
    # computes the KV it lost a second time.
    assert sample(engine, "vllm:iteration_tokens_total_sum") == 2 * (100 + 59) + lost
    assert engine.pool.free == 16
    # Each finished request reports how often it was preempted.
    assert sample(engine, "vllm:request_num_preemptions_count") == 2
    assert sample(engine, "vllm:request_num_preemptions_sum") == 1


@pytest.mark.parametrize(
    "prompts", [[512], [512] * 3, [512] * 8, [256, 768], [100, 1000, 4000]], ids=str
)
def test_a_decode_step_costs_d0_plus_d1_b_plus_d2_b_ctx(prompts: list[int]) -> None:
    engine, clock = make_engine()
    for i, p in enumerate(prompts):
        engine.submit(f"r{i}", p, 2, "length")
    drive(engine, clock)  # one prefill step for all, then one decode step for all
    batch = len(prompts)
    context = sum(p + 1 for p in prompts)  # B * mean context
    want_ms = MODEL.decode_d0_ms + MODEL.decode_d1_ms * batch + MODEL.decode_d2_ms * context
    assert sample(engine, "vllm:inter_token_latency_seconds_count") == batch
    # Every sequence of the batch waited the same step for its second token.
    assert sample(engine, "vllm:inter_token_latency_seconds_sum") == pytest.approx(
        batch * want_ms / 1e3
    )


def test_a_new_request_joins_the_running_batch_at_the_next_step() -> None:
    engine, clock = make_engine()
    [running] = submit(engine, 1, prompt=1000, max_tokens=20)
    drive(engine, clock, steps=3)
    itl_before = sample(engine, "vllm:inter_token_latency_seconds_sum")
    joining = engine.submit("late", 2000, 5, "length")
    drive(engine, clock, steps=1)
    assert (running.generated, joining.generated) == (4, 1)
    # One mixed step: the prefill of the newcomer and the decode of the running request.
    mixed = MODEL.step_seconds([(2000, 0)], 1, 1000 + 3)
    assert ttft(joining) == pytest.approx(mixed)
    itl = sample(engine, "vllm:inter_token_latency_seconds_sum") - itl_before
    assert itl == pytest.approx(mixed)  # the running request's token waited for the prefill


class GatedPuller:
    """A prefill engine whose READs complete when the test opens the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.notified: list[str] = []

    async def read(self, remote: RemotePrefill) -> None:
        await self.gate.wait()

    async def notify(self, remote: RemotePrefill) -> None:
        self.notified.append(remote.request_id)

    async def heartbeat(self, remote: RemotePrefill, request_ids: list[str]) -> None:
        return None


async def _no_sleep(_: float) -> None:
    return None


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the transfer task did not get there")


WAITING: list[tuple[str, dict[str, str]]] = (
    [("vllm:num_requests_waiting", {})]
    + [("vllm:num_requests_waiting_by_reason", {"reason": r}) for r in ("capacity", "deferred")]
    + [
        ("vllm:num_requests_kv_fetch_by_stage", {"stage": s})
        for s in ("waiting_to_start", "in_progress", "completed_waiting")
    ]
)


def waiting(engine: Engine) -> list[float]:
    """The waiting gauges, in WAITING's order."""
    return [sample(engine, name, **labels) for name, labels in WAITING]


async def test_a_decode_pulling_kv_is_deferred_by_fetch_stage_and_counted_as_transferred() -> None:
    clock, puller = Clock(), GatedPuller()
    metrics = EngineMetrics("m", kv_role="kv_consumer")
    engine = Engine(MODEL, EngineConfig("m"), metrics, puller, wall=clock, sleep=_no_sleep)
    remote = RemotePrefill("prefill-a", "cmpl-p-0-12345678", "10.0.0.1", 5600, (7, 8), True)
    pulled = engine.submit("pulled", 20, 4, "length", remote=remote)
    engine.submit("local", 30, 4, "length")
    # waiting, capacity, deferred, waiting_to_start, in_progress, completed_waiting
    assert waiting(engine) == [2, 2, 0, 1, 0, 0]
    drive(engine, clock, steps=1)  # allocates the pulled one's blocks and posts its READ
    await _until(lambda: pulled.kv_state == "transferring")
    # vLLM's waiting gauge is capacity + deferred; a request whose KV is in flight is deferred.
    assert waiting(engine) == [1, 0, 1, 0, 1, 0]
    puller.gate.set()
    await _until(lambda: pulled.kv_state == "ready")
    assert waiting(engine) == [1, 0, 1, 0, 0, 1]
    assert puller.notified == ["cmpl-p-0-12345678"]  # the READ's notification frees P's KV
    drive(engine, clock)
    assert waiting(engine) == [0, 0, 0, 0, 0, 0]
    # Every prompt token of the pulled request came over NIXL, every one of the other was
    # computed here.
    by_source = "vllm:prompt_tokens_by_source_total"
    assert sample(engine, by_source, source="external_kv_transfer") == 20
    assert sample(engine, by_source, source="local_compute") == 30
    assert sample(engine, "vllm:nixl_xfer_time_seconds_count") == 1
