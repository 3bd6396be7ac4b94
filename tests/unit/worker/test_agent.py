"""Where the agent's hooks (`prestop`, `ready`) reach the engine."""

from __future__ import annotations

import pytest

from pdfleet_worker.agent import base_url


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "http://127.0.0.1:8000"),
        ({"PDFLEET_PORT": "9000"}, "http://127.0.0.1:9000"),
        ({"PDFLEET_HOST": "0.0.0.0", "PDFLEET_PORT": "8000"}, "http://127.0.0.1:8000"),
        ({"PDFLEET_HOST": "::"}, "http://127.0.0.1:8000"),
        ({"PDFLEET_HOST": " "}, "http://127.0.0.1:8000"),
        # The engine binds one address only (the e2e process bridge binds the pod IP).
        ({"PDFLEET_HOST": "10.244.1.7", "PDFLEET_PORT": "8000"}, "http://10.244.1.7:8000"),
        ({"PDFLEET_HOST": "fd00::7"}, "http://[fd00::7]:8000"),
    ],
)
def test_base_url_follows_the_bound_address(env: dict[str, str], url: str) -> None:
    assert base_url(env) == url
