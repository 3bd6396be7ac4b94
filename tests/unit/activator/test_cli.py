"""`pdfleet activator`: its arguments."""

from __future__ import annotations

import pytest

from pdfleet.cli import build_parser


def test_arguments_and_defaults() -> None:
    args = build_parser().parse_args(
        ["activator", "--upstream", "http://svc-router.ns:8000", "--service", "ns/svc"]
    )
    assert args.command == "activator"
    assert args.upstream == "http://svc-router.ns:8000"
    assert args.service == ("ns", "svc")
    assert args.listen == ("0.0.0.0", 8080)
    assert args.max_wait == 300.0
    assert args.retry_after == 30.0


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9000", ("127.0.0.1", 9000)),
        (":9000", ("0.0.0.0", 9000)),
        ("[::]:80", ("::", 80)),
    ],
)
def test_listen(listen: str, expected: tuple[str, int]) -> None:
    argv = "activator --upstream http://r --service ns/svc --max-wait 2.5"
    args = build_parser().parse_args([*argv.split(), "--listen", listen])
    assert args.listen == expected
    assert args.max_wait == 2.5


@pytest.mark.parametrize(
    "bad",
    [
        ["--service", "svc"],
        ["--service", "ns/"],
        ["--service", "ns/a/b"],
        ["--service", "ns/svc", "--listen", "host"],
        ["--service", "ns/svc", "--listen", "h:99999"],
        ["--service", "ns/svc", "--max-wait", "0"],
        ["--service", "ns/svc", "--max-wait", "soon"],
    ],
)
def test_refused(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["activator", "--upstream", "http://r", *bad])
    assert exited.value.code == 2
    assert "activator: error" in capsys.readouterr().err


@pytest.mark.parametrize("gone", [["--kubeconfig", "/k"], ["--wake-every", "30"]])
def test_it_takes_no_credentials_and_signals_no_wake(
    gone: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator reads its /metrics to wake the service: it never talks to the API server."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(
            ["activator", "--upstream", "http://r", "--service", "ns/svc", *gone]
        )
    assert exited.value.code == 2
    assert f"unrecognized arguments: {' '.join(gone)}" in capsys.readouterr().err
