"""The ``llmso`` command: ``serve`` and ``prepare-model``, plus the subcommands other
installed packages add through the ``llmso.commands`` entry-point group (this project's
``bench`` and ``plan``, declared in pyproject.toml): the gateway never imports them.

``serve`` runs one gateway process; with more than one worker (``--workers``, else
``LLMSO_WORKERS``, else ``server.workers``) it runs the supervisor of
``gateway.fleet.supervisor``, which starts each worker as ``python -m gateway.cli serve``
with its seat in the environment (docs/workers.md)."""

from __future__ import annotations

import argparse
import gc
import logging
import math
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from config.loader import ConfigError, load_config
from config.schema import AppConfig, HFModelConfig, workers_refusal
from gateway.edge.settings import Settings
from gateway.fleet.link import FleetLink, Seat
from gateway.observe.logs import configure_logging

if TYPE_CHECKING:
    from gateway.edge.drain import CloseWhileDraining

log = logging.getLogger("llmso")

PLUGINS = "llmso.commands"
"""Entry-point group of extra subcommands: each names a ``main(argv: list[str]) -> int``."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins = _plugins()
    if argv and argv[0] in plugins:
        command: Callable[[list[str]], int] = plugins[argv[0]].load()
        return command(argv[1:])
    args = _parser(plugins).parse_args(argv)
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    try:
        config = load_config(args.config or settings.config)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"llmso: bad config: {line}", file=sys.stderr)
        return 2
    if args.command == "prepare-model":
        return _prepare_models(config)
    bind = Bind.of(args, settings, config)
    refusal = workers_refusal(config, bind.workers)
    if refusal is not None:
        print(f"llmso: {refusal}", file=sys.stderr)
        return 2
    seat = Seat.from_environ()
    if seat is not None:  # started by a supervisor: one worker of its fleet
        return _serve(config, settings, bind, seat)
    if bind.workers > 1:
        return _supervise(config, bind)
    return _serve(config, settings, bind, None)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


@dataclass(frozen=True, slots=True)
class Bind:
    """Where and how wide ``llmso serve`` serves: each a flag, else its ``LLMSO_*``
    environment variable, else the config's ``server:`` value."""

    host: str
    port: int
    workers: int

    @classmethod
    def of(cls, args: argparse.Namespace, settings: Settings, config: AppConfig) -> Bind:
        server = config.server
        port = _first(getattr(args, "port", None), settings.port, server.port)
        workers = _first(getattr(args, "workers", None), settings.workers, server.workers)
        return cls(args.host or settings.host or server.host, port, workers)


def _first(*values: int | None) -> int:
    return next(value for value in values if value is not None)


def _plugins() -> dict[str, EntryPoint]:
    """The installed subcommands of ``PLUGINS``, by name (loaded only when run)."""
    return {entry.name: entry for entry in entry_points(group=PLUGINS)}


def _parser(plugins: dict[str, EntryPoint]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmso", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="Start the gateway.")
    serve.add_argument("--config", type=Path, help="YAML config (env LLMSO_CONFIG).")
    serve.add_argument("--host", help="Bind address (env LLMSO_HOST; default from config).")
    serve.add_argument("--port", type=int, help="Bind port (env LLMSO_PORT; default from config).")
    serve.add_argument(
        "--workers",
        type=_positive,
        help="Gateway processes on the port (env LLMSO_WORKERS; default from config: "
        "server.workers).",
    )
    prepare = commands.add_parser(
        "prepare-model", help="Resolve (and convert once) every local hf model source."
    )
    prepare.add_argument("--config", type=Path, help="YAML config (env LLMSO_CONFIG).")
    for name, entry in sorted(plugins.items()):
        commands.add_parser(name, help=f"From {entry.module}; see `llmso {name} --help`.")
    return parser


def _prepare_models(config: AppConfig) -> int:
    from backends.hf.loading.model_source import ModelSourceError, resolve_source

    for model in config.models:
        if not isinstance(model, HFModelConfig):
            continue
        try:
            resolved = resolve_source(model.source)
        except ModelSourceError as exc:
            print(f"llmso: model {model.name}: {exc}", file=sys.stderr)
            return 2
        print(f"{model.name}: {resolved.path_or_id}")
    return 0


def served_app(
    config: AppConfig, settings: Settings, bind_host: str, fleet: FleetLink | None = None
) -> CloseWhileDraining:
    """The ASGI app ``llmso serve`` runs: the gateway of ``config``, answering with
    ``Connection: close`` while it drains; ``fleet``: its link, when it is a worker."""
    from gateway.app import build_app
    from gateway.edge.drain import CloseWhileDraining

    app = build_app(
        config,
        admin_key=settings.admin_key,
        watch_config=settings.watch_config,
        bind_host=bind_host,
        fleet=fleet,
    )
    return CloseWhileDraining(app, app.state.drain)


def _serve(config: AppConfig, settings: Settings, bind: Bind, seat: Seat | None) -> int:
    """Serve in this process: alone, or as worker ``seat`` of a fleet (on a socket of its
    own on the fleet's port, drained by its supervisor)."""
    import uvicorn

    from gateway.edge.drain import DrainingServer, SupervisedServer
    from gateway.edge.transport import http_protocol

    link = None if seat is None else FleetLink(seat)
    if seat is not None:
        # A worker takes its orders from the supervisor (SIGUSR1/SIGUSR2, see
        # SupervisedServer); until its handlers are in, a reload signal or one sent to
        # the whole process group must not end it.
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    app = served_app(config, settings, bind.host, link)
    server_config = uvicorn.Config(
        app,
        host=bind.host,
        port=bind.port,
        # uvloop, accepting new connections in batches (gateway.edge.accept: libuv
        # takes one a loop iteration, which a busy gateway makes tens of ms)
        loop="gateway.edge.accept:new_loop",
        # httptools, headers sent with the first body bytes, a stalled client dropped
        http=http_protocol(config.server.send_timeout),
        log_config=None,
        access_log=False,
        # Nothing in llmso reads the client address or scheme from the scope, so
        # uvicorn's X-Forwarded-* rewriting would be one more layer per request for
        # nothing; and no `server: uvicorn` header on every answer.
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=math.ceil(config.server.drain_timeout),
        timeout_keep_alive=math.ceil(config.server.keep_alive_timeout),
    )
    tune_gc()
    grace = config.server.drain_grace
    if link is None:
        DrainingServer(server_config, app.drain, grace).run()
        return 0
    from gateway.fleet.sockets import reuseport_socket

    server = SupervisedServer(server_config, app.drain, grace)
    link.on_lost = server.supervisor_lost
    # Bound once the app is built: the kernel queues connections for this worker only
    # from here, a moment before its loop accepts them.
    sock = reuseport_socket(bind.host, bind.port, backlog=server_config.backlog)
    server.run(sockets=[sock])
    return 0


def _supervise(config: AppConfig, bind: Bind) -> int:
    from gateway.fleet.supervisor import FleetPlan, Supervisor

    try:
        plan = FleetPlan.of(config, bind.workers, bind.host, bind.port)
        return Supervisor(plan).run()
    except (OSError, ValueError) as exc:
        print(f"llmso: cannot start {bind.workers} workers: {exc}", file=sys.stderr)
        return 2


def tune_gc() -> None:
    """Fewer, cheaper garbage collections on the request path (profiled at ~2 % of the
    gateway's CPU per streamed request): what start-up built lives as long as the process
    and is frozen out of the collector's scans, and the young generation is collected
    every 20,000 net allocations instead of 700 (one streamed request makes ~1,000)."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


if __name__ == "__main__":
    raise SystemExit(main())
