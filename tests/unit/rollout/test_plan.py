"""The paired rollout's state machine, step by step, from what the objects show."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pdfleet.rollout.plan import (
    UNPINNED,
    Phase,
    PoolLayout,
    PoolState,
    RolloutPlan,
    plan_rollout,
    surge_sizes,
)

ONE_GPU = {"prefill": 1, "decode": 1}
ROLES = ("prefill", "decode")


def pools(
    replicas: tuple[int, int],
    revision: str | None,
    partition: tuple[int, int] = (0, 0),
    start: int = 0,
) -> dict[str, PoolState | None]:
    return {
        role: PoolState(n, start, part, revision)
        for role, n, part in zip(ROLES, replicas, partition, strict=True)
    }


def step(
    target: str,
    states: Mapping[str, PoolState | None],
    router: str | None,
    desired: tuple[int, int] = (1, 2),
    ready: tuple[int, int] = (0, 0),
    router_rolled: bool = True,
    proven: bool = True,
    budget: int | None = None,
    pinned: bool = True,
    unlabelled: int = 0,
) -> RolloutPlan:
    return plan_rollout(
        target, states, router, router_rolled, dict(zip(ROLES, desired, strict=True)),
        dict(zip(ROLES, ready, strict=True)), proven, ONE_GPU, budget, pinned, unlabelled,
    )  # fmt: skip


def test_a_stable_service_scales_as_the_autoscaler_says_and_keeps_its_start() -> None:
    plan = step("r1", pools((1, 2), "r1", start=3), "r1", desired=(2, 3))
    assert plan.phase is Phase.STABLE and plan.router == "r1"
    assert plan.pools == {"prefill": PoolLayout(2, start=3), "decode": PoolLayout(3, start=3)}


@pytest.mark.parametrize(
    ("states", "router", "pinned"),
    [
        ({"prefill": None, "decode": None}, None, True),  # a new service
        (pools((1, 2), None), None, True),  # made before revisions were labelled
        (pools((1, 2), "r1"), "r1", False),  # an external router: nothing to pin
    ],
)
def test_what_cannot_be_paired_rolls_in_place(
    states: dict[str, PoolState | None], router: str | None, pinned: bool
) -> None:
    plan = step("r2", states, router, pinned=pinned)
    assert plan.phase is Phase.STABLE and plan.router == "r2"
    assert all(layout.partition == 0 for layout in plan.pools.values())


def test_a_new_revision_surges_beside_the_old_which_keeps_the_router() -> None:
    plan = step("r2", pools((1, 2), "r1"), "r1", desired=(1, 2))
    assert plan.phase is Phase.SURGING and plan.router == "r1"
    assert plan.pools["prefill"] == PoolLayout(2, partition=1)
    assert plan.pools["decode"] == PoolLayout(4, partition=2)
    assert plan.old == {"prefill": 1, "decode": 2}


def test_the_router_moves_only_once_both_new_pools_are_ready_and_proven() -> None:
    surging = pools((2, 4), "r2", partition=(1, 2))
    assert step("r2", surging, "r1", ready=(1, 1)).router == "r1"
    unproven = step("r2", surging, "r1", ready=(1, 2), proven=False)
    assert unproven.router == "r1" and "preflight" in unproven.waiting
    moved = step("r2", surging, "r1", ready=(1, 2))
    assert moved.phase is Phase.MOVING_TRAFFIC and moved.router == "r2"
    assert moved.pools["decode"] == PoolLayout(4, partition=2), "both revisions stay meanwhile"


def test_the_old_revision_retires_after_the_router_has_rolled_then_the_start_moves() -> None:
    moved = pools((2, 4), "r2", partition=(1, 2), start=5)
    rolling = step("r2", moved, "r2", router_rolled=False)
    assert rolling.phase is Phase.MOVING_TRAFFIC
    assert all(layout.retire == 0 for layout in rolling.pools.values())
    retiring = step("r2", moved, "r2")
    assert retiring.phase is Phase.RETIRING
    decode = retiring.pools["decode"]
    assert (decode.replicas, decode.partition, decode.retire) == (4, 2, 2)
    assert decode.then == PoolLayout(2, start=7), "the start moves past the two old pods"
    done = retiring.retired({"decode"})
    assert done.pools["decode"] == PoolLayout(2, start=7)
    assert done.pools["prefill"] is retiring.pools["prefill"], "still draining"
    after = step("r2", pools((1, 2), "r2", start=7), "r2", desired=(1, 2))
    assert after.phase is Phase.STABLE


def test_a_revert_before_traffic_moved_removes_the_new_pods_only() -> None:
    surging = pools((2, 4), "r2", partition=(1, 2))
    plan = step("r1", surging, "r1", desired=(1, 2))
    assert plan.phase is Phase.REVERTING and plan.router == "r1"
    # No partition, so the next pass sees a stable pool; the drain removes the top positions.
    assert plan.pools == {"prefill": PoolLayout(1), "decode": PoolLayout(2)}
    assert step("r1", pools((2, 4), "r1"), "r1").phase is Phase.STABLE


def test_a_newer_revision_replaces_a_surge_that_never_served() -> None:
    plan = step("r3", pools((2, 4), "r2", partition=(1, 2)), "r1", desired=(1, 2))
    assert plan.phase is Phase.SURGING and plan.router == "r1"
    assert plan.pools["decode"] == PoolLayout(4, partition=2)


def test_a_newer_revision_waits_for_the_old_to_retire_then_surges_in_the_same_write() -> None:
    retiring = pools((2, 4), "r2", partition=(1, 2))
    plan = step("r3", retiring, "r2", desired=(1, 2))
    assert plan.phase is Phase.RETIRING and plan.router == "r2"
    assert all(layout.hold for layout in plan.pools.values()), "r2's pods must not roll"
    then = plan.retired({"prefill", "decode"}).pools
    assert then["decode"] == PoolLayout(4, start=2, partition=2)
    assert then["prefill"] == PoolLayout(2, start=1, partition=1)


def test_pools_whose_surge_was_written_for_one_role_only_keep_the_other_pool() -> None:
    half = {"prefill": PoolState(2, 0, 1, "r2"), "decode": PoolState(2, 0, 0, "r1")}
    plan = step("r2", half, "r1", desired=(1, 2))
    assert plan.phase is Phase.SURGING
    assert plan.pools["decode"] == PoolLayout(4, partition=2), "old decodes kept, new added"


def test_the_surge_fits_the_budget_at_the_same_ratio() -> None:
    assert surge_sizes({"prefill": 2, "decode": 4}, {"prefill": 2, "decode": 4}, ONE_GPU, None) == {
        "prefill": 2,
        "decode": 4,
    }
    fitted = surge_sizes({"prefill": 2, "decode": 4}, {"prefill": 2, "decode": 4}, ONE_GPU, 9)
    assert fitted == {"prefill": 1, "decode": 2}
    # Never less than one pair: a rollout needs one to prove.
    assert surge_sizes({"prefill": 2, "decode": 4}, {"prefill": 2, "decode": 4}, ONE_GPU, 6) == {
        "prefill": 1,
        "decode": 1,
    }


def test_the_autoscaler_during_a_surge_resizes_the_new_pools_only_within_the_budget() -> None:
    """The old revision serves at its size until it retires; a decision sizes the new pools,
    fitted beside the old into the GPU budget (3 old + new <= 8 GPUs)."""
    surging = pools((2, 3), "r2", partition=(1, 2))
    grown = step("r2", surging, "r1", desired=(2, 4), budget=None)
    assert grown.pools["prefill"] == PoolLayout(3, partition=1)
    assert grown.pools["decode"] == PoolLayout(6, partition=2)
    fitted = step("r2", surging, "r1", desired=(2, 4), budget=8)
    assert fitted.pools["prefill"].partition == 1 and fitted.pools["decode"].partition == 2
    new = {role: layout.replicas - layout.partition for role, layout in fitted.pools.items()}
    assert sum(new.values()) + 3 <= 8 and new["decode"] >= new["prefill"] >= 1, new


def test_pools_made_before_revision_labels_keep_an_unpinned_router_until_all_have_rolled() -> None:
    """Pinned at once, the router would select none of the old pods while they roll in place
    to gain the label: an outage on the operator's upgrade."""
    labelled_templates = pools((1, 2), "r1")
    rolling = step("r1", labelled_templates, None, unlabelled=2)
    assert rolling.phase is Phase.STABLE and rolling.router == UNPINNED
    assert step("r1", pools((1, 2), None), None, unlabelled=3).router == UNPINNED
    assert step("r1", labelled_templates, None, unlabelled=0).router == "r1"
