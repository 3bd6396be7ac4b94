"""How a Gateway decides whether an HTTPRoute forwards a path, for tests of the rendered route.

No Gateway implementation runs in the local cluster, so the tests apply the Gateway API's
path matching rules (HTTPPathMatch) to the route pdfleet renders, as a conforming Gateway
would, and send whatever passes to a real vllm-router.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def route_allows(route: Mapping[str, Any], path: str) -> bool:
    """Whether `route` forwards a request for `path` (the raw path, before any
    normalisation a Gateway may do): PathPrefix matches whole path segments ("/v1/" matches
    "/v1/models", not "/v10"); Exact matches the path itself."""
    for rule in route["spec"]["rules"]:
        for match in rule.get("matches", ()):
            kind, value = match["path"]["type"], match["path"]["value"]
            prefix = value.rstrip("/")
            if kind == "Exact" and path == value:
                return True
            if kind == "PathPrefix" and (path == prefix or path.startswith(prefix + "/")):
                return True
    return False
