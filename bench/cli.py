"""``llmso bench``: load-test one server, compare several, or run a built-in suite.

    llmso bench run --base-url URL --model NAME [--concurrency 1,4,16 | --rate 2,5] ...
    llmso bench compare --spec FILE.yaml --out DIR
    llmso bench suite {models,prefix,gpu,overhead} --out DIR [--quick] [--model-path PATH]

``main(argv)`` returns a process exit code: 0 when it ran (request errors are results, shown
in the table), 1 when nothing succeeded or a system could not start, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from bench.client import RequestOptions
from bench.compare import run_compare, summarised
from bench.gpu_suite import gpu_models_suite
from bench.loadgen import LoadSpec, new_session, run_level
from bench.machine import machine_info
from bench.prefix_suite import prefix_suite
from bench.procstat import CpuWindow, group_cpu_seconds
from bench.prompts import builtin_prompts, load_prompts
from bench.report import RunRecord, markdown_table, plot, write_json
from bench.spec import CompareSpec, load_spec
from bench.stats import Slo
from bench.suites import models_suite, overhead_suite

T = TypeVar("T")
log = logging.getLogger("bench")


def positive_ints(text: str) -> tuple[int, ...]:
    """An argparse type: ``1,4,16``."""
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("expected positive integers like 1,4,16")
    return values


def _float_list(text: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in text.split(",") if v.strip())
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("expected positive numbers like 0.5,2")
    return values


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="Load-test one OpenAI-compatible server.")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="The model name sent in each request.")
    p.add_argument("--label", default=None, help="Name of this system in tables and plots.")
    p.add_argument("--api", choices=("chat", "completions"), default="chat", help="Which API.")
    p.add_argument(
        "--stream", action=argparse.BooleanOptionalAction, default=True, help="SSE or one body."
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency", type=positive_ints, default=None, help="Closed loop: 1,4,16."
    )
    load.add_argument("--rate", type=_float_list, default=None, help="Open loop, requests/s.")
    p.add_argument("--num-requests", type=int, default=None, help="Per level (default max(8, 2c)).")
    p.add_argument("--duration", type=float, default=None, help="Seconds per level (cap).")
    p.add_argument("--warmup", type=int, default=2, help="Requests per level not measured.")
    p.add_argument("--max-tokens", type=int, default=64, help="Per request.")
    p.add_argument("--temperature", type=float, default=0.0, help="Per request.")
    p.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Send ignore_eos: true so every request generates exactly max_tokens.",
    )
    p.add_argument("--prompts", type=Path, default=None, help="JSON-lines prompt file.")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="Goodput: TTFT bound.")
    p.add_argument("--slo-itl-ms", type=float, default=None, help="Bound on each request's TPOT.")
    p.add_argument("--timeout", type=float, default=300.0, help="Seconds per request.")
    p.add_argument("--api-key", default=None, help="Sent as a bearer token.")
    p.add_argument("--seed", type=int, default=0, help="Poisson arrival seed.")
    p.add_argument("--server-pid", type=int, default=None, help="Measure this process group's CPU.")
    p.add_argument("--out", type=Path, default=None, help="Write results.{json,md,png} here.")


def _add_compare(sub: Any) -> None:
    p = sub.add_parser("compare", help="Run several systems from a YAML/JSON spec, alternating.")
    p.add_argument("--spec", type=Path, required=True, help="Systems and load (bench/spec.py).")
    p.add_argument("--out", type=Path, required=True, help="Write results.{json,md,png} here.")
    p.add_argument("--workdir", type=Path, default=None, help="Scratch (configs, logs).")


def _add_suite(sub: Any) -> None:
    p = sub.add_parser("suite", help="A built-in comparison: models, prefix, gpu or overhead.")
    p.add_argument("name", choices=("models", "prefix", "gpu", "overhead"), help="The suite.")
    p.add_argument("--out", type=Path, required=True, help="Write results.{json,md,png} here.")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="Repository root.")
    p.add_argument("--model-path", default=None, help="Model folder (all but overhead).")
    p.add_argument("--quick", action="store_true", help="Tiny smoke run.")
    p.add_argument("--concurrency", type=positive_ints, default=None, help="Levels: 1,4,16.")
    p.add_argument(
        "--dtype", default="bfloat16", choices=("float32", "bfloat16"), help="Model weights."
    )
    p.add_argument("--no-vllm", action="store_true", help="Leave vLLM out of the models suite.")
    p.add_argument(
        "--python",
        type=Path,
        default=None,
        help="gpu: interpreter for the gateway and the reference (default .venv-gpu's).",
    )
    p.add_argument(
        "--level-duration", type=float, default=None, help="Override the suite's cap (s)."
    )
    p.add_argument("--systems", default=None, help="Only these labels, comma-separated.")
    p.add_argument(
        "--hf-threads", type=int, default=None, help="torch threads of llmso hf (default: all)."
    )
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="Override the suite's SLO.")
    p.add_argument("--slo-itl-ms", type=float, default=None, help="Override the suite's SLO.")
    p.add_argument(
        "--rounds", type=int, default=None, help="Measure each level N times (interleaved)."
    )
    p.add_argument("--workdir", type=Path, default=None, help="Scratch (configs, logs).")
    p.add_argument("--dry-run", action="store_true", help="Print the spec as JSON and exit.")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmso bench", description=__doc__.split("\n\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    sub = p.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_compare(sub)
    _add_suite(sub)
    return p


async def _cancellable(coro: Awaitable[T]) -> T:
    """Run ``coro``; SIGTERM cancels it so ``finally`` blocks (process cleanup) still run."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def _run_levels(args: argparse.Namespace) -> list[RunRecord]:
    prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts(256)
    options = RequestOptions(
        base_url=args.base_url,
        model=args.model,
        api=args.api,
        stream=args.stream,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        timeout_s=args.timeout,
        api_key=args.api_key,
    )
    loads: list[LoadSpec] = []
    if args.rate:
        for rate in args.rate:
            n = args.num_requests or (None if args.duration else max(8, int(rate * 30)))
            loads.append(
                LoadSpec(
                    rate=rate,
                    num_requests=n,
                    duration_s=args.duration,
                    warmup=args.warmup,
                    seed=args.seed,
                )
            )
    else:
        for c in args.concurrency or (1,):
            n = args.num_requests or (None if args.duration else max(8, 2 * c))
            loads.append(
                LoadSpec(
                    concurrency=c, num_requests=n, duration_s=args.duration, warmup=args.warmup
                )
            )
    slo = Slo(args.slo_ttft_ms, args.slo_itl_ms)
    label = args.label or args.model
    records = []
    biggest = max((lv.concurrency or lv.max_inflight) for lv in loads)
    async with new_session(biggest + 4) as session:
        for load in loads:
            window = CpuWindow(
                lambda: group_cpu_seconds(args.server_pid) if args.server_pid else None
            )
            run = await run_level(session, options, prompts, load, window.start)
            record = summarised(
                label, load, run, stream=args.stream, slo=slo, server_cpu=window.seconds()
            )
            records.append(record)
            log.info(
                "%s %s: %d/%d ok", label, load.label, record.summary.ok, record.summary.requests
            )
    return records


def _cmd_run(args: argparse.Namespace) -> int:
    records = asyncio.run(_cancellable(_run_levels(args)))
    print(markdown_table(records), end="")
    if args.out:
        meta = {**machine_info(), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_json(args.out / "results.json", records, meta)
        (args.out / "results.md").write_text(markdown_table(records), encoding="utf-8")
        plot(args.out / "results.png", records, f"llmso bench: {records[0].system}")
    return 0 if any(r.summary.ok for r in records) else 1


def _compare(spec: CompareSpec, out: Path, workdir: Path | None, meta: dict[str, Any]) -> int:
    work = workdir or Path(tempfile.mkdtemp(prefix="llmso-bench-"))
    log.info("scratch folder (configs, server logs): %s", work)
    records = asyncio.run(_cancellable(run_compare(spec, out, work, meta)))
    print(markdown_table(records), end="")
    working = {r.system for r in records if r.summary.ok}
    missing = [s.label for s in spec.systems if s.label not in working]
    if missing:
        log.error("no successful requests for %s; logs under %s", ", ".join(missing), work / "logs")
    for r in records:
        errors = [x.error for x in r.samples if x.error]
        if errors:
            log.warning(
                "%s %s: %d errors (warm-up included), first: %s",
                r.system,
                r.load,
                len(errors),
                errors[0],
            )
    return 1 if missing or not records else 0


_MODEL_SUITES = {"models": models_suite, "prefix": prefix_suite, "gpu": gpu_models_suite}


def _cmd_suite(args: argparse.Namespace) -> int:
    root = args.root.resolve()
    if args.name in _MODEL_SUITES:
        if not args.model_path:
            log.error("the %s suite needs --model-path (the converted model folder)", args.name)
            return 2
        if args.python and args.name != "gpu":
            log.error("--python is an option of the gpu suite only")
            return 2
        spec = _MODEL_SUITES[args.name](
            root,
            args.model_path,
            quick=args.quick,
            concurrency=args.concurrency,
            dtype=args.dtype,
            include_vllm=not args.no_vllm,
            hf_threads=args.hf_threads,
            **({"python": args.python} if args.python else {}),
        )
    else:
        spec = overhead_suite(root, quick=args.quick, concurrency=args.concurrency)
    overrides = {
        "slo_ttft_ms": args.slo_ttft_ms,
        "slo_itl_ms": args.slo_itl_ms,
        "rounds": args.rounds,
        "level_duration_s": args.level_duration,
    }
    spec = spec.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    if args.systems:
        keep = set(args.systems.split(","))
        unknown = keep - {s.label for s in spec.systems}
        if unknown:
            log.error("unknown systems %s", ", ".join(sorted(unknown)))
            return 2
        baseline = spec.baseline if spec.baseline in keep else None
        spec = spec.model_copy(
            update={
                "systems": tuple(s for s in spec.systems if s.label in keep),
                "baseline": baseline,
            }
        )
    if args.dry_run:
        print(json.dumps(spec.model_dump(mode="json"), indent=1))
        return 0
    meta = {"command": " ".join(["llmso", "bench", *args.argv])}
    return _compare(spec, args.out, args.workdir, meta)


def main(argv: list[str]) -> int:
    """Entry point for ``llmso bench ARGS...`` (``argv`` excludes ``bench`` itself)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on errors
        return int(exc.code or 0)
    args.argv = list(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "compare":
            spec = load_spec(args.spec)
            return _compare(
                spec, args.out, args.workdir, {"command": f"compare --spec {args.spec}"}
            )
        return _cmd_suite(args)
    except (ValueError, OSError) as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        return 130
