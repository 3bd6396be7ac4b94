"""The paths a service's clients may send: the OpenAI API and the router's probes.

vllm-router serves its admin API (`DELETE /workers/<url>`, `/remove_worker`, `/add_worker`,
`/flush_cache`) on the port that serves `/v1/*`, without authentication. Two fronts keep clients
to these paths, from this one list: the Gateway API HTTPRoute that `pdfleet render
--http-route` prints (pdfleet.render.network), and the activator, which answers 404 itself for
anything else (pdfleet.activator.server).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

PATH_PREFIXES = ("/v1/",)
EXACT_PATHS = ("/liveness", "/readiness")
# A `.` or `..` segment, between slashes of either kind or at an end.
DOT_SEGMENT = re.compile(r"(^|[/\\])\.{1,2}($|[/\\])")


def is_client_path(raw_path: str) -> bool:
    """Whether a request target (path and query, as sent, percent-encoded) is the client API.

    A path under a prefix must not climb out of it: no `.` or `..` segment, however encoded
    and whichever slash separates it. The target is forwarded byte for byte, so a router, or
    a proxy behind it, that resolves dot segments can never turn `/v1/../workers/<url>` into
    the admin API."""
    path = raw_path.split("?", 1)[0]
    if path in EXACT_PATHS:
        return True
    if not path.startswith(PATH_PREFIXES):
        return False
    decoded = path
    # until stable: %252e is %2e after one proxy has decoded it, and "." after two
    while (once := unquote(decoded)) != decoded:
        decoded = once
    return not DOT_SEGMENT.search(decoded)
