"""The ``llmso`` command: ``serve`` and ``prepare-model``, plus the subcommands other
installed packages add through the ``llmso.commands`` entry-point group (this project's
``bench`` and ``plan``, declared in pyproject.toml): the gateway never imports them."""

from __future__ import annotations

import argparse
import gc
import logging
import math
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from config.loader import ConfigError, load_config
from config.schema import AppConfig, HFModelConfig
from gateway.edge.settings import Settings
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
    return _serve(config, settings, args.host, args.port)


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


def served_app(config: AppConfig, settings: Settings, bind_host: str) -> CloseWhileDraining:
    """The ASGI app ``llmso serve`` runs: the gateway of ``config``, answering with
    ``Connection: close`` while it drains."""
    from gateway.app import build_app
    from gateway.edge.drain import CloseWhileDraining

    app = build_app(
        config,
        admin_key=settings.admin_key,
        watch_config=settings.watch_config,
        bind_host=bind_host,
    )
    return CloseWhileDraining(app, app.state.drain)


def bind_address(
    config: AppConfig, settings: Settings, host: str | None, port: int | None
) -> tuple[str, int]:
    """Where ``llmso serve`` listens: each of host and port from the flag, else the
    environment (``LLMSO_HOST``/``LLMSO_PORT``), else the config's ``server:`` section,
    whose defaults are 127.0.0.1 and 8000."""
    bind_host = host or settings.host or config.server.host
    bind_port = next(p for p in (port, settings.port, config.server.port) if p is not None)
    return bind_host, bind_port


def _serve(config: AppConfig, settings: Settings, host: str | None, port: int | None) -> int:
    import uvicorn

    bind_host, bind_port = bind_address(config, settings, host, port)
    from gateway.edge.drain import DrainingServer
    from gateway.edge.transport import http_protocol

    app = served_app(config, settings, bind_host)
    server_config = uvicorn.Config(
        app,
        host=bind_host,
        port=bind_port,
        loop="uvloop",
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
    DrainingServer(server_config, app.drain, config.server.drain_grace).run()
    return 0


def tune_gc() -> None:
    """Fewer, cheaper garbage collections on the request path (profiled at ~2 % of the
    gateway's CPU per streamed request): what start-up built lives as long as the process
    and is frozen out of the collector's scans, and the young generation is collected
    every 20,000 net allocations instead of 700 (one streamed request makes ~1,000)."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


if __name__ == "__main__":
    raise SystemExit(main())
