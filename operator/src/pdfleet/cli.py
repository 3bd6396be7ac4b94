"""The `pdfleet` command: run the operator or an activator, render manifests, print the CRD.

pdfleet operator run [--namespace NS ...] [--kubeconfig FILE]
pdfleet activator --upstream URL --service NAMESPACE/NAME [--listen HOST:PORT]
                  [--max-wait SECONDS] [--retry-after SECONDS]
pdfleet render -f FILE [--replicas prefill=2 --replicas decode=3] [--http-route NS/GATEWAY]
pdfleet crd

The activator (pdfleet.activator) holds one service's requests while it is at zero; it holds
no API credentials, and the operator reads its /metrics to wake the service
(docs/design/scale-to-zero.md).

The autoscaler's benchmark is not part of the operator: `python -m pdfleet_lab.bench`.
"""

from __future__ import annotations

import argparse
import http.server
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pydantic
import yaml

from pdfleet import labels
from pdfleet.api.rules import error_paths
from pdfleet.api.v1alpha1 import InferenceService
from pdfleet.reconcile.plan import desired_replicas
from pdfleet.render import RenderConfig, render_children
from pdfleet.render.network import http_route

if TYPE_CHECKING:
    from pdfleet.autoscale.actuator import MetricsSource

log = logging.getLogger("pdfleet")


def _load_services(path: str) -> list[InferenceService]:
    text = sys.stdin.read() if path == "-" else open(path).read()  # noqa: SIM115
    services = []
    for doc in yaml.safe_load_all(text):
        if not doc or doc.get("kind") != labels.KIND:
            continue
        try:
            services.append(InferenceService.model_validate(doc))
        except pydantic.ValidationError as error:
            name = (doc.get("metadata") or {}).get("name", "?")
            raise SystemExit(f"{path}: {name}: " + "; ".join(error_paths(error))) from None
    return services


def _parse_replicas(items: Sequence[str]) -> dict[str, int]:
    result = {}
    for item in items:
        role, _, count = item.partition("=")
        if role not in labels.WORKER_ROLES or not count.isdigit():
            raise SystemExit(f"--replicas takes prefill=N or decode=N, not {item!r}")
        result[role] = int(count)
    return result


def _render_config(args: argparse.Namespace) -> RenderConfig:
    return RenderConfig(router_image=args.router_image, activator_image=args.activator_image)


def _image_options(parser: argparse.ArgumentParser) -> None:
    """The images of the children that are not workers (the spec names those)."""
    parser.add_argument(
        "--router-image", default=os.environ.get("PDFLEET_ROUTER_IMAGE", RenderConfig.router_image)
    )
    parser.add_argument(
        "--activator-image",
        default=os.environ.get("PDFLEET_ACTIVATOR_IMAGE", RenderConfig.activator_image),
        help="the image that runs `pdfleet activator` (the operator's own) for services that "
        "scale to zero",
    )


def cmd_render(args: argparse.Namespace) -> int:
    config = _render_config(args)
    documents = []
    for isvc in _load_services(args.filename):
        if isvc.metadata.namespace is None:
            isvc = isvc.model_copy(
                update={"metadata": isvc.metadata.model_copy(update={"namespace": args.namespace})}
            )
        replicas = {**desired_replicas(isvc, None), **_parse_replicas(args.replicas)}
        documents += render_children(isvc, replicas, config)
        if args.http_route:
            gateway_namespace, _, gateway = args.http_route.rpartition("/")
            documents.append(http_route(isvc, gateway_namespace or args.namespace, gateway))
    yaml.SafeDumper.ignore_aliases = lambda *_: True  # type: ignore[method-assign]
    sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False, width=100))
    return 0


def cmd_crd(_: argparse.Namespace) -> int:
    from pdfleet.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return 0


def cmd_operator_run(args: argparse.Namespace) -> int:
    import kopf

    from pdfleet import gcpause, metrics
    from pdfleet.autoscale.actuator import Autoscaler
    from pdfleet.controller import Controller
    from pdfleet.handlers import register
    from pdfleet.kube.api import KubeWriter, load_api_client
    from pdfleet.kube.lease import LeaderElector

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it too
    gcpause.install()
    api = load_api_client(args.kubeconfig)
    controller = Controller(
        KubeWriter(api),
        _render_config(args),
        autoscaler=Autoscaler(source_for=_prometheus_sources(), clock_s=time.time),
    )
    registry = kopf.OperatorRegistry()
    register(controller, registry, args.resync_seconds, api, args.namespace, args.workers)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: object) -> None:
        settings.posting.enabled = False  # pdfleet records its own, meaningful Events
        settings.peering.standalone = True  # one active replica comes from the Lease
        settings.execution.max_workers = args.workers
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        # The operator's kinds are known: no cluster-wide API discovery, which a namespaced
        # install (no cluster rights beyond the CRD) may not do.
        settings.scanning.disabled = True

    stop = threading.Event()
    lost = threading.Event()

    @kopf.on.cleanup(registry=registry)
    def release_stop_flag(**_: object) -> None:
        # kopf waits for the stop flag in a thread of the loop's default executor, and
        # asyncio.run joins that thread on the way out: after a SIGTERM, which stops kopf
        # without the flag, the process would linger until the kubelet's SIGKILL.
        stop.set()

    elector = None
    if args.metrics_port:
        metrics.serve(args.metrics_port, addr=args.bind)
    if args.leader_election:
        identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
        elector = LeaderElector(api, args.lease_namespace, args.lease_name, identity)
        # A standby is healthy while it waits; kopf's own endpoint takes over once leading.
        standby = _standby_health(args.bind, args.health_port) if args.health_port else None
        try:
            if not elector.wait_for_leadership(stop):
                return 0
        finally:
            if standby is not None:
                standby.shutdown()
                standby.server_close()

        def on_lost() -> None:
            lost.set()
            stop.set()

        threading.Thread(
            target=elector.keep_renewing, args=(stop, on_lost), name="lease", daemon=True
        ).start()
    metrics.LEADER.set(1)
    try:
        kopf.run(
            registry=registry,
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace or (),
            liveness_endpoint=f"http://{args.bind}:{args.health_port}/healthz"
            if args.health_port
            else None,
            stop_flag=stop,
        )
    finally:
        metrics.LEADER.set(0)
        stop.set()
        if elector is not None and not lost.is_set():
            elector.release()
    return 1 if lost.is_set() else 0


def cmd_activator(args: argparse.Namespace) -> int:
    import asyncio

    from pdfleet.activator import server

    namespace, name = args.service
    host, port = args.listen
    settings = server.Settings(
        upstream=args.upstream,
        max_wait_s=args.max_wait,
        service=f"{namespace}/{name}",
        retry_after_s=args.retry_after,
    )
    asyncio.run(server.run(server.Activator(settings), host, port))
    return 0


def _service_ref(value: str) -> tuple[str, str]:
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"NAMESPACE/NAME, not {value!r}")
    return namespace, name


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"HOST:PORT, not {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"a positive number of seconds, not {value!r}")
    return seconds


def _standby_health(host: str, port: int) -> http.server.HTTPServer:
    """/healthz -> 200 while this replica waits for the lease (liveness must not kill it)."""

    class Healthz(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"standby\n")

        def log_message(self, *args: object) -> None:  # probes every few seconds: stay quiet
            pass

    server = http.server.HTTPServer((host, port), Healthz)
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    return server


def _prometheus_sources() -> Callable[[str], MetricsSource]:
    """One PrometheusSource per URL, made on first use."""
    from pdfleet.autoscale.metrics import PrometheusSource

    sources: dict[str, MetricsSource] = {}
    lock = threading.Lock()

    def source_for(url: str) -> MetricsSource:
        with lock:
            if url not in sources:
                sources[url] = PrometheusSource(url)
            return sources[url]

    return source_for


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdfleet", description=__doc__.split("\n")[0])
    parser.add_argument("--log-level", default=os.environ.get("PDFLEET_LOG_LEVEL", "INFO"))
    commands = parser.add_subparsers(dest="command", required=True)

    render = commands.add_parser("render", help="print the child manifests for a spec")
    render.add_argument("-f", "--filename", required=True, help="YAML file, or - for stdin")
    render.add_argument("-n", "--namespace", default="default")
    render.add_argument("--replicas", action="append", default=[], metavar="ROLE=N")
    _image_options(render)
    render.add_argument(
        "--http-route",
        metavar="[NAMESPACE/]GATEWAY",
        help="also print a Gateway API HTTPRoute to the router that lets only /v1/* through",
    )

    commands.add_parser("crd", help="print the CustomResourceDefinition")

    operator = commands.add_parser("operator", help="run the operator")
    operator_commands = operator.add_subparsers(dest="operator_command", required=True)
    run = operator_commands.add_parser("run", help="run against the current kubeconfig")
    run.add_argument("--kubeconfig", default=None)
    run.add_argument("-n", "--namespace", action="append", default=[],
                     help="watch only these namespaces (repeatable); default: all")  # fmt: skip
    _image_options(run)
    run.add_argument("--bind", default="0.0.0.0", help="address of the metrics/health servers")
    run.add_argument("--metrics-port", type=int, default=8080)
    run.add_argument("--health-port", type=int, default=8081)
    run.add_argument("--resync-seconds", type=float, default=60.0)
    run.add_argument(
        "--workers", type=int, default=16, help="reconcile passes at once (they wait on the API)"
    )
    run.add_argument("--leader-election", action=argparse.BooleanOptionalAction, default=True)
    run.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    run.add_argument("--lease-name", default="pdfleet-operator")
    run.add_argument("--identity", default=os.environ.get("POD_NAME"))

    activator = commands.add_parser(
        "activator", help="hold a service's requests while it is at zero"
    )
    activator.add_argument(
        "--upstream",
        required=True,
        metavar="URL",
        help="the router Service, e.g. http://svc-router.ns:8000",
    )
    activator.add_argument(
        "--service",
        required=True,
        type=_service_ref,
        metavar="NAMESPACE/NAME",
        help="its InferenceService, named in the 503's message and the logs",
    )
    activator.add_argument(
        "--listen", type=_host_port, default=("0.0.0.0", 8080), metavar="HOST:PORT"
    )
    activator.add_argument(
        "--max-wait",
        type=_seconds,
        default=300.0,
        metavar="SECONDS",
        help="hold a request this long at most, then answer 503",
    )
    activator.add_argument(
        "--retry-after",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="the Retry-After of that 503",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Per-event handler chatter and probe access logs drown what matters at INFO.
    for noisy in ("kopf.objects", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    if args.command == "render":
        return cmd_render(args)
    if args.command == "crd":
        return cmd_crd(args)
    if args.command == "activator":
        return cmd_activator(args)
    return cmd_operator_run(args)


if __name__ == "__main__":
    sys.exit(main())
