"""Pure parts of the load generator and the demo: arrivals, stream parsing, summaries, view."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from e2e.platform.loadgen import (
    ERROR,
    OK,
    TRUNCATED,
    Phase,
    Record,
    arrivals,
    parse_stream_line,
    prompt_of,
    streamed_text,
    summarize,
)
from e2e.scenarios.demo import Sample, demo_phases, label_phases, plot, render_view, summary_text


def test_arrivals_are_poisson_within_each_phase_and_reproducible() -> None:
    phases = [
        Phase("a", 100.0, 2.0, 10, 5),
        Phase("b", 50.0, 0.0, 10, 5),
        Phase("c", 100.0, 4.0, 10, 5),
    ]
    first = arrivals(phases, seed=7)
    assert first == arrivals(phases, seed=7)
    a = [t for t, p in first if p.name == "a"]
    c = [t for t, p in first if p.name == "c"]
    assert not [t for t, p in first if p.name == "b"]
    assert all(0 <= t < 100 for t in a) and all(150 <= t < 250 for t in c)
    assert 150 < len(a) < 250 and 320 < len(c) < 480  # rate x duration, within Poisson noise
    assert [t for t, _ in first] == sorted(t for t, _ in first)


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ('data: {"choices": [{"text": " the", "index": 0}]}', (False, 1)),
        ('data: {"choices": [{"text": "", "finish_reason": "length"}]}', (False, 0)),
        ("data: [DONE]", (True, 0)),
        ("", (False, 0)),
        (": keep-alive", (False, 0)),
    ],
)
def test_parse_stream_line(line: str, parsed: tuple[bool, int]) -> None:
    assert parse_stream_line(line) == parsed


def test_streamed_text_joins_completion_and_chat_chunks_up_to_done() -> None:
    text = ['data: {"choices": [{"text": "the"}]}', "", 'data: {"choices": [{"text": " cat"}]}']
    assert streamed_text([*text, "data: [DONE]"]) == "the cat"
    chat = ['data: {"choices": [{"delta": {"role": "assistant"}}]}',
            'data: {"choices": [{"delta": {"content": "hi"}}]}', "data: [DONE]"]  # fmt: skip
    assert streamed_text(chat, chat=True) == "hi"


@pytest.mark.parametrize(
    ("lines", "names"),
    [
        (['data: {"choices": [{"text": "the"}]}'], "without [DONE]"),
        (['data: {"error": {"message": "overloaded"}}', "data: [DONE]"], "overloaded"),
    ],
)
def test_streamed_text_refuses_a_broken_or_failed_stream(lines: list[str], names: str) -> None:
    with pytest.raises(ValueError, match=re.escape(names)):
        streamed_text(lines)


def test_prompt_length_in_simulator_tokens() -> None:
    from pdfleet_worker.sim.tokens import count_text_tokens

    assert count_text_tokens(prompt_of(1234)) == 1234


def test_summarize_counts_outcomes_and_percentiles() -> None:
    records = [
        Record("p", float(i), OK, ttft_s=0.1 * (i + 1), itl_s=0.01, tokens=5) for i in range(10)
    ]
    records += [Record("p", 0.0, ERROR), Record("p", 0.0, TRUNCATED, tokens=2)]
    stats = summarize(records)
    assert (stats["requests"], stats["ok"], stats["errors"], stats["truncated"]) == (12, 10, 1, 1)
    assert stats["ttft_p50_s"] == pytest.approx(0.55)
    assert stats["itl_p90_s"] == pytest.approx(0.01)
    assert math.isnan(summarize([])["ttft_p50_s"])


def _sample(t: float, prefill: int, decode: int) -> Sample:
    counts = {"desired": prefill, "ready": prefill, "draining": 0, "pending": 0}
    return Sample(t, "long prompts", counts, {**counts, "desired": decode, "ready": decode},
                  0.3, 0.006, 2.5, 0, "prefill 1->2, decode 1")  # fmt: skip


def test_view_and_summary() -> None:
    slo = {"ttft": {"target": "500ms"}, "itl": {"target": "7ms"}}
    screen = render_view(_sample(12.0, 2, 1), slo, total=40, ok=40)
    assert "prefill" in screen and "target 500ms" in screen and "prefill 1->2" in screen
    records = [Record("p", 1.0, OK, ttft_s=0.3, itl_s=0.006, tokens=16)]
    text = summary_text(records, [_sample(0, 1, 1), _sample(5, 3, 1)], 100.0, (0.5, 0.007))
    assert "100.0% of completed requests" in text and "prefill 3, decode 1" in text


def test_demo_load_first_stresses_prefill_then_decode() -> None:
    phases = {p.name: p for p in demo_phases()}
    prompts, outputs = phases["long prompts"], phases["long outputs"]
    assert prompts.rate * prompts.prompt_tokens > outputs.rate * outputs.prompt_tokens
    assert outputs.output_tokens > 10 * prompts.output_tokens


def _demo_samples(speed: float) -> list[Sample]:
    counts = {"desired": 2, "ready": 2, "draining": 0, "pending": 0}
    samples, t = [], 0.0
    for phase in demo_phases(speed):
        end = t + phase.duration_s
        while t < end:
            rate = 0.0 if t == 0 else phase.rate
            samples.append(Sample(t, phase.name, counts, counts, 0.3, 0.006, rate, 0, ""))
            t += 2.0 * speed
    return samples


@pytest.mark.parametrize("speed", [1.0, 0.5, 0.1])
def test_demo_plot_phase_names_are_all_shown_and_never_overlap(
    speed: float, tmp_path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = _demo_samples(speed)
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.plot([s.t for s in samples], [s.rate for s in samples])
    fig.tight_layout()
    starts: dict[str, float] = {}
    for s in samples:
        starts.setdefault(s.phase, s.t)
    label_phases(ax, starts)
    fig.canvas.draw()
    boxes = {text.get_text(): text.get_window_extent() for text in ax.texts}
    plt.close(fig)
    assert sorted(boxes) == sorted(p.name for p in demo_phases())
    names = sorted(boxes)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not boxes[a].overlaps(boxes[b]), (a, b)
    # The whole plot renders with them.
    plot(samples, (0.5, 0.007), tmp_path / "demo.png")
    assert (tmp_path / "demo.png").stat().st_size > 10_000
