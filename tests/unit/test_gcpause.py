"""Full collections freeze their survivors, and hand them back once per thaw interval."""

from __future__ import annotations

import gc

from pdfleet import gcpause


def _full(callback: gcpause.FreezeAfterFullCollections) -> None:
    callback("start", {"generation": 2})
    callback("stop", {"generation": 2, "collected": 0, "uncollectable": 0})


def test_survivors_of_a_full_collection_are_frozen_and_thawed_once_an_interval() -> None:
    clock, calls = [0.0], []
    callback = gcpause.FreezeAfterFullCollections(
        thaw_s=60.0,
        clock=lambda: clock[0],
        freeze=lambda: calls.append("freeze"),
        unfreeze=lambda: calls.append("unfreeze"),
    )
    callback("start", {"generation": 0})  # young collections: nothing to do
    callback("stop", {"generation": 1, "collected": 0, "uncollectable": 0})
    assert calls == []
    _full(callback)
    clock[0] = 30.0
    _full(callback)
    assert calls == ["freeze", "freeze"]
    clock[0] = 61.0
    _full(callback)  # an interval since the first: the next full collection sees all
    assert calls[-1] == "unfreeze"
    clock[0] = 70.0
    _full(callback)
    assert calls[-1] == "freeze"


def test_installed_once_and_a_real_full_collection_freezes() -> None:
    before = list(gc.callbacks)
    try:
        callback = gcpause.install()
        assert gcpause.install() is callback
        assert sum(isinstance(c, gcpause.FreezeAfterFullCollections) for c in gc.callbacks) == 1
        survivor = [{"kept": i} for i in range(100)]
        gc.collect()
        assert gc.get_freeze_count() >= len(survivor)
    finally:
        gc.callbacks[:] = before
        gc.unfreeze()
