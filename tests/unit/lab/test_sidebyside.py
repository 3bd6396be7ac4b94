"""The two simulators side by side (`pdfleet_lab.sidebyside`): rows, the targets each run
misses, and the committed `simulators.md` pages against the JSONs they are made from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pdfleet_lab import sidebyside

DOCS = Path(__file__).resolve().parents[3] / "docs" / "benchmarks" / "autoscale"


def _result(runs: dict[str, Any], ratios: dict[str, Any]) -> dict[str, Any]:
    return {
        "workload": "W9_test",
        "runs": runs,
        "cheapest_fixed": {"prefill": 3, "decode": 1, "gpu_hours": 4.0},
        "ratios": ratios,
    }


@pytest.mark.parametrize(
    ("name", "run", "ratios", "misses"),
    [
        ("all met", {"attainment": 0.96, "gpu_hours": 3.6, "flaps": 0},
         {"vs_cheapest_fixed": 0.9, "vs_clairvoyant": 1.15}, ()),
        ("every one missed", {"attainment": 0.94, "gpu_hours": 4.0, "flaps": 1},
         {"vs_cheapest_fixed": 1.0, "vs_clairvoyant": 1.16},
         ("attainment", "bound", "fixed", "flaps")),
        ("failed", {"failed": "killed: stalled"}, {}, ("failed",)),
    ],
)  # fmt: skip
def test_a_hinted_run_misses_what_it_does_not_meet(
    name: str, run: dict[str, Any], ratios: dict[str, float], misses: tuple[str, ...]
) -> None:
    (row,) = sidebyside.rows_of(_result({"pdfleet": run}, {"pdfleet": ratios}), "DynoSim")
    assert row.misses() == misses, name
    assert row.fixed == "3P1D 4.00"


def test_a_run_without_a_hint_is_held_to_the_looser_bound() -> None:
    run = {"attainment": 0.97, "gpu_hours": 4.2, "flaps": 0}
    ratios = {"vs_cheapest_fixed": 0.95, "vs_clairvoyant": 1.25}
    result = _result(
        {"pdfleet": run, "pdfleet-learned": run}, {"pdfleet": ratios, "pdfleet-learned": ratios}
    )
    hint, learned = sidebyside.rows_of(result, "FleetSim")
    assert (hint.misses(), learned.misses()) == (("bound",), ())
    table = sidebyside.markdown([learned, hint])
    assert table.splitlines()[2].startswith(
        "| W9_test | FleetSim | hint | 97.00% | 4.20 | 3P1D 4.00 |"
    )
    assert table.splitlines()[3].endswith("| 1.250 | 0 | none |")


@pytest.mark.parametrize("folder", [DOCS, DOCS / "heldout"], ids=["W1-W3", "heldout"])
def test_committed_pages_are_what_their_results_give(folder: Path) -> None:
    rows = sidebyside.collect(folder)
    assert {r.simulator for r in rows} == {"FleetSim", "DynoSim"}
    page = (folder / sidebyside.OUTPUT).read_text()
    assert page == sidebyside.page(rows), f"regenerate: python -m pdfleet_lab.sidebyside {folder}"
