"""``llmso serve`` with batch state that outlives the process (kill -9 and restart on
the same directory), and the SDK calls the batch tests and drill share."""

from __future__ import annotations

import io
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import openai
import orjson

from tests.tools.servers import (
    VENV_BIN,
    RunningServer,
    free_port,
    start_process,
    stop_process,
    write_config,
)


class BatchGateway:
    """One ``llmso serve`` at a time on ``config`` (its ``batch.directory`` set to
    ``<directory>/state``)."""

    def __init__(self, directory: Path, config: dict[str, Any]) -> None:
        self.state = directory / "state"
        config = {**config, "batch": {**config.get("batch", {}), "directory": str(self.state)}}
        self.config_path = write_config(directory, config)
        self.server: RunningServer | None = None

    def start(self, timeout: float = 300.0) -> None:
        port = free_port()
        argv = [str(VENV_BIN / "llmso"), "serve", "--config", str(self.config_path)]
        self.server = start_process(
            [*argv, "--port", str(port)],
            port=port,
            health_path="/ready",
            timeout=timeout,
            env={"LLMSO_WATCH_CONFIG": "false"},
        )

    def kill(self) -> None:
        """SIGKILL, no goodbye: what a crash leaves behind."""
        assert self.server is not None
        os.killpg(self.server.process.pid, signal.SIGKILL)
        self.server.process.wait(10)

    def stop(self) -> None:
        if self.server is not None:
            stop_process(self.server)

    def client(self) -> openai.OpenAI:
        assert self.server is not None
        return openai.OpenAI(base_url=self.server.url + "/v1", api_key="unused", max_retries=0)

    def running_lines(self, batch_id: str) -> int:
        """Lines the runner marked started and has not finished (read from its database)."""
        path = self.state / "batches.sqlite3"
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM started WHERE batch_id=? AND line NOT IN "
                "(SELECT line FROM results WHERE batch_id=?)",
                (batch_id, batch_id),
            ).fetchone()
        return int(count)


def submit(client: openai.OpenAI, endpoint: str, lines: list[dict[str, Any]]) -> str:
    data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    file = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(
        input_file_id=file.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    ).id


def completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    return 0 if counts is None else counts.completed


def output_ids(client: openai.OpenAI, file_id: str | None) -> list[str]:
    """The ``custom_id`` of each line of an output file, in order."""
    if file_id is None:
        return []
    content = client.files.content(file_id).content
    return [orjson.loads(line)["custom_id"] for line in content.splitlines()]
