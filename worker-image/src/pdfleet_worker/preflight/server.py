"""The preflight listener each worker pod runs beside its engine (`pdfleet-agent
preflight-serve`, started by `pdfleet-agent launch` when PDFLEET_PREFLIGHT_PORT is set).

Where it fits: the operator asks a decode pod to measure (`POST /preflight/run`); that pod's
listener runs the initiator (transfer.run), which asks the prefill pod's listener for an offer
(`POST /preflight/offer`), READs it over NIXL and releases it (`POST /preflight/release`).
Running inside the worker pods is the point: the measurement uses the pods' own GPUs, RDMA
devices, capabilities and UCX settings, which a separate Job could neither get next to full
pools nor prove. Standard library HTTP only: the listener must stay small beside vLLM.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pdfleet_wire.preflight as wire
from pdfleet_worker.preflight import transfer

log = logging.getLogger("pdfleet.preflight")
OFFER_TTL_S = 300.0
DEFAULT_PORT = 5590


class Listener(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], env: Mapping[str, str]) -> None:
        super().__init__(address, Handler)
        self.env = dict(env)
        backends = [b for b in self.env.get("PDFLEET_KV_BACKENDS", "UCX").split(",") if b]
        self.target = transfer.Target(transfer.target_name(env), backends or ["UCX"], env)
        self.run_lock = threading.Lock()  # one measurement at a time: runs would skew each other


class Handler(BaseHTTPRequestHandler):
    server: Listener

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)

    def _reply(self, status: HTTPStatus, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        data = json.loads(self.rfile.read(length) or b"{}")
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data

    def do_GET(self) -> None:
        if self.path == "/preflight/health":
            channel = transfer.side_channel(self.server.env)
            self._reply(HTTPStatus.OK, {"ok": True, "sideChannel": channel})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        routes = {
            "/preflight/offer": self._offer,
            "/preflight/release": self._release,
            "/preflight/run": self._run,
        }
        route = routes.get(self.path)
        if route is None:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
            return
        try:
            body = self._body()
            self._reply(HTTPStatus.OK, route(body))
        except (KeyError, ValueError, TypeError) as err:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"{type(err).__name__}: {err}"})
        except Exception as err:  # NIXL/UCX errors: report, keep listening
            log.exception("preflight %s failed", self.path)
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(err).__name__}: {err}"})

    def _offer(self, body: Mapping[str, Any]) -> dict[str, Any]:
        nbytes = int(body["bytes"])
        if not 0 < nbytes <= 64 << 30:
            raise ValueError(f"bytes={nbytes} is out of range")
        return self.server.target.offer(
            nbytes, int(body["seed"]), body.get("memory") or None, OFFER_TTL_S
        )

    def _release(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return {"released": self.server.target.release(str(body["id"]))}

    def _run(self, body: Mapping[str, Any]) -> dict[str, Any]:
        request = wire.PreflightRequest.from_json(body)
        with self.server.run_lock:
            return transfer.run(request, self.server.env).to_json()


def listen_address(env: Mapping[str, str]) -> tuple[str, int]:
    """The pod IP when known (the process bridge runs every pod in one network namespace),
    else every address."""
    host = env.get("PDFLEET_POD_IP", "").strip() or "0.0.0.0"
    port = int(env.get("PDFLEET_PREFLIGHT_PORT", "").strip() or DEFAULT_PORT)
    return host, port


def serve(env: Mapping[str, str] | None = None) -> None:
    env = dict(os.environ if env is None else env)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    listener = Listener(listen_address(env), env)
    log.info("preflight listener on %s:%d", *listener.server_address[:2])
    listener.serve_forever()
