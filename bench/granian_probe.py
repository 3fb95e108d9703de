"""The gateway app for granian, to measure granian against ``llmso serve`` (issue 13).

A measurement probe, not a supported way to run llmso: nothing imports it, granian is not
a dependency, and what only ``llmso serve`` gives (the drain on SIGTERM of
``gateway.edge.drain.DrainingServer``, the disconnect callback and header coalescing of
``gateway.edge.transport``) is absent here. ``app`` serves what ``llmso serve`` does
(``gateway.cli.served_app``: the config from ``LLMSO_CONFIG``, the same settings, logging
and GC tuning, wrapped in ``CloseWhileDraining``) so that only the server differs::

    LLMSO_CONFIG=gw.yaml PYTHONPATH=.:GRANIAN_DIR python -m granian \\
        $(python -m bench.granian_probe --port 18702)

``python -m bench.granian_probe`` prints granian's arguments for one setting (see
``granian_args``); ``bench/granian_ab.py`` runs the A/B against uvicorn.
"""

from __future__ import annotations

import argparse
from typing import Any


def app() -> Any:
    """ASGI app factory for ``granian --factory bench.granian_probe:app``. Runs in
    granian's worker process; the drain flag is never set (granian handles SIGTERM)."""
    from config.loader import load_config
    from gateway.cli import served_app, tune_gc
    from gateway.edge.settings import Settings
    from gateway.observe.logs import configure_logging

    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    config = load_config(settings.config)
    served = served_app(config, settings, settings.host or config.server.host)
    tune_gc()
    return served


def granian_args(
    port: int,
    *,
    host: str = "127.0.0.1",
    runtime_mode: str = "st",
    task_impl: str = "asyncio",
    loop: str = "uvloop",
    runtime_blocking_threads: int | None = None,
) -> list[str]:
    """granian's command-line arguments for the probe: ASGI with lifespan, one worker,
    one runtime thread, one blocking thread (granian refuses more for ASGI), HTTP/1
    only, no websockets, no access log."""
    extra = (
        []
        if runtime_blocking_threads is None
        else [
            "--runtime-blocking-threads",
            str(runtime_blocking_threads),
        ]
    )
    return [
        "--interface",
        "asgi",
        "--factory",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--runtime-threads",
        "1",
        "--runtime-mode",
        runtime_mode,
        "--blocking-threads",
        "1",
        *extra,
        "--task-impl",
        task_impl,
        "--loop",
        loop,
        "--http",
        "1",
        "--no-ws",
        "--no-access-log",
        "--log-level",
        "warning",
        "bench.granian_probe:app",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print granian's arguments for the probe.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--runtime-mode", choices=("st", "mt"), default="st")
    parser.add_argument("--task-impl", choices=("asyncio", "rust"), default="asyncio")
    parser.add_argument("--loop", choices=("uvloop", "asyncio", "rloop"), default="uvloop")
    parser.add_argument("--runtime-blocking-threads", type=int, default=None)
    args = parser.parse_args(argv)
    print(
        " ".join(
            granian_args(
                args.port,
                host=args.host,
                runtime_mode=args.runtime_mode,
                task_impl=args.task_impl,
                loop=args.loop,
                runtime_blocking_threads=args.runtime_blocking_threads,
            )
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
