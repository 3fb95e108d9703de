"""Machine notes recorded next to every result: CPU, cores, memory, load, versions."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("llmso", "aiohttp", "torch", "transformers", "fastapi", "uvicorn")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def venv_package_version(venv: Path, *names: str) -> str | None:
    """``name==version`` of the first of ``names`` installed in another virtualenv.

    Read from its dist-info folder, so nothing from that environment gets imported here.
    """
    for name in names:
        for dist in sorted(venv.glob(f"lib/python*/site-packages/{name}-*.dist-info")):
            return f"{name}=={dist.name[len(name) + 1 : -len('.dist-info')]}"
    return None


def command_output(argv: list[str], timeout: float = 10) -> str | None:
    """``argv``'s first line of output, or ``None`` if it cannot run, fails or says nothing."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _git_commit() -> str | None:
    return command_output(["git", "rev-parse", "--short", "HEAD"], timeout=5)


def machine_info() -> dict[str, Any]:
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "mem_total_gib": _mem_total_gib(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {name: _version(name) for name in _PACKAGES},
        "git_commit": _git_commit(),
        "argv": sys.argv,
    }


def study_meta(module: str, argv: list[str]) -> dict[str, Any]:
    """What an in-process study records before it starts: the machine, the load average,
    the UTC start and the command that reruns it."""
    return {
        "machine": machine_info(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": f"python -m {module} " + " ".join(argv),
    }


def study_footer(meta: dict[str, Any], threads: int, rounds: int | None) -> list[str]:
    """The closing lines of a study's markdown: where, how loaded, when, and how to rerun."""
    repeats = "" if rounds is None else f", {rounds} rounds"
    return [
        "",
        f"{meta['machine']['cpu_model']}, {meta['machine']['cpus_usable']} usable CPUs, torch "
        f"threads {threads}{repeats}; load average at start "
        f"{meta['loadavg_at_start']}, at the end {meta.get('loadavg_at_end')}; "
        f"{meta['started']}.",
        f"Command: `{meta['command']}`.",
        "",
    ]


def write_study(out: Path, stem: str, record: dict[str, Any], markdown: str) -> None:
    """``<out>/<stem>.json`` (the record) and ``<out>/<stem>.md`` (its table), and the
    table on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    print(markdown)
