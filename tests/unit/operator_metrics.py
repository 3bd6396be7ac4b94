"""Reading the operator's own metrics (pdfleet.metrics) back from what /metrics serves.

The registry is process-wide and other tests move the same series, so counters are judged by
what changed inside a block (`counted`), never by their absolute value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families

from pdfleet import metrics

Labels = frozenset[tuple[str, str]]


def labels(**values: str) -> Labels:
    return frozenset(values.items())


def samples(name: str) -> dict[Labels, float]:
    """Every sample called `name` (e.g. `pdfleet_drain_forced_total`), by its labels."""
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name == name
    }


def value(name: str, **values: str) -> float | None:
    """One sample's value; None when the series does not exist (never set, or dropped)."""
    return samples(name).get(labels(**values))


@contextlib.contextmanager
def counted(name: str) -> Iterator[dict[Labels, float]]:
    """Fills the yielded dict, when the block ends, with how much each series called `name`
    moved inside it (series that did not move are left out), also when the block raises."""
    before = samples(name)
    changes: dict[Labels, float] = {}
    try:
        yield changes
    finally:
        for key, after in samples(name).items():
            if after != before.get(key, 0.0):
                changes[key] = after - before.get(key, 0.0)
