"""Events are posted beside the passes: recording one never waits for the API server."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pytest

from e2e.platform.cluster import wait_until
from pdfleet.kube import api
from pdfleet.kube.api import KubeWriter, event_body
from pdfleet.kube.errors import APIError

SERVICE = {
    "apiVersion": "pdfleet.ai/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "svc", "namespace": "ns", "uid": "u-1"},
}


class SlowServer:
    """Stands in for KubeWriter._call: holds every POST until released, fails on request."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.posted: list[dict[str, Any]] = []
        self.fail_first = False

    def call(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        assert (method, path) == ("POST", "/api/v1/namespaces/ns/events")
        self.release.wait(5)
        if self.fail_first:
            self.fail_first = False
            raise APIError(500, "etcd timeout")
        self.posted.append(body)
        return {}


def _writer(monkeypatch: pytest.MonkeyPatch, server: SlowServer) -> KubeWriter:
    writer = KubeWriter(api=None)  # type: ignore[arg-type]  # never reached: _call is replaced
    monkeypatch.setattr(writer, "_call", server.call)
    return writer


def _wait_for(check: Callable[[], bool]) -> None:
    wait_until(check, 5, "the event posters", interval_s=0.01)


def test_recording_an_event_returns_before_the_api_server_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = SlowServer()
    writer = _writer(monkeypatch, server)
    writer.event(SERVICE, "Created", "children created")
    assert server.posted == []  # the server holds it: the pass went on regardless
    server.release.set()
    _wait_for(lambda: len(server.posted) == 1)
    posted = server.posted[0]
    assert posted["reason"] == "Created" and posted["involvedObject"]["uid"] == "u-1"


def test_a_failed_post_is_logged_and_the_next_event_still_goes_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server = SlowServer()
    server.fail_first = True
    server.release.set()
    writer = _writer(monkeypatch, server)
    monkeypatch.setattr(api, "EVENT_POSTERS", 1)  # one poster: the failure comes first
    writer.event(SERVICE, "First", "lost to the server")
    writer.event(SERVICE, "Second", "posted")
    _wait_for(lambda: len(server.posted) == 1)
    assert server.posted[0]["reason"] == "Second"
    assert "could not record event First on svc: etcd timeout" in caplog.text


def test_a_full_backlog_drops_new_events_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(api, "EVENT_BACKLOG", 2)
    monkeypatch.setattr(api, "EVENT_POSTERS", 1)
    server = SlowServer()
    writer = _writer(monkeypatch, server)
    writer.event(SERVICE, "Held", "the poster takes it and waits on the server")
    _wait_for(lambda: writer._events.empty())
    writer.event(SERVICE, "Queued-1", "")
    writer.event(SERVICE, "Queued-2", "")
    writer.event(SERVICE, "Dropped", "")
    server.release.set()
    _wait_for(lambda: len(server.posted) == 3)
    assert [e["reason"] for e in server.posted] == ["Held", "Queued-1", "Queued-2"]
    assert "event backlog full; dropped Dropped on svc" in caplog.text


def test_the_event_names_its_object_and_is_cut_to_the_api_limit() -> None:
    body = event_body(SERVICE, "Stalled", "x" * 5000, "Warning", "pdfleet-operator")
    assert body["metadata"] == {"generateName": "svc.", "namespace": "ns"}
    assert body["type"] == "Warning" and body["source"] == {"component": "pdfleet-operator"}
    assert len(body["message"]) == 1024


class Recorder:
    """Stands in for KubeWriter._call: names each posted Event, keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.expired: set[str] = set()

    def call(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path, body))
        if method == "PATCH" and path.rpartition("/")[2] in self.expired:
            raise APIError(404, "Not Found")
        return {"metadata": {"name": f"svc.{len(self.calls)}"}}


def _posted(server: Recorder, count: int) -> bool:
    return len(server.calls) == count


def test_a_repeated_event_counts_up_on_the_one_posted(monkeypatch: pytest.MonkeyPatch) -> None:
    server = Recorder()
    writer = KubeWriter(api=None)  # type: ignore[arg-type]
    monkeypatch.setattr(writer, "_call", server.call)
    for i in range(3):  # a pass apart each: two posters may take two of a burst at once
        writer.event(SERVICE, "MetricsUnavailable", "MetricsMissing: no series", "Warning")
        _wait_for(functools.partial(_posted, server, i + 1))
    writer.event(SERVICE, "MetricsUnavailable", "MetricsStale: 600s old", "Warning")
    _wait_for(lambda: len(server.calls) == 4)
    methods = [(m, p.rpartition("/")[2]) for m, p, _ in server.calls]
    assert methods == [("POST", "events"), ("PATCH", "svc.1"), ("PATCH", "svc.1"),
                       ("POST", "events")]  # fmt: skip
    assert [body["count"] for _, _, body in server.calls[1:3]] == [2, 3]


def test_an_expired_event_starts_a_new_series(monkeypatch: pytest.MonkeyPatch) -> None:
    server = Recorder()
    writer = KubeWriter(api=None)  # type: ignore[arg-type]
    monkeypatch.setattr(writer, "_call", server.call)
    writer.event(SERVICE, "Stalled", "pod x: ImagePullBackOff", "Warning")
    _wait_for(lambda: len(server.calls) == 1)
    server.expired.add("svc.1")  # the API server's Event TTL removed it
    writer.event(SERVICE, "Stalled", "pod x: ImagePullBackOff", "Warning")
    _wait_for(lambda: len(server.calls) == 3)
    assert [c[0] for c in server.calls] == ["POST", "PATCH", "POST"]


def test_a_series_is_forgotten_after_its_window() -> None:
    series = api.EventSeries(window_s=600.0, kept=2)
    key = ("u-1", "Warning", "Stalled", "m")
    series.posted(key, "svc.a", now=0.0)
    assert series.repeat(key, now=10.0) == ("svc.a", 2)
    assert series.repeat(key, now=700.0) is None  # 690 s after it was last seen
    for i in range(3):
        series.posted((f"u-{i}", "Normal", "Scaled", "m"), f"e{i}", now=0.0)
    assert series.repeat(("u-0", "Normal", "Scaled", "m"), now=1.0) is None  # only 2 kept
