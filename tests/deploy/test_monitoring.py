"""Monitoring assets against real servers: a real Prometheus (Debian package, ``make
prometheus``) started with deploy/prometheus/llmso.yml scrapes a live gateway (in front
of the fake upstream, two replica URLs) and answers ``llmso_requests_total`` through its
HTTP API; ``promtool`` checks the config and the rules and runs the rules' unit tests;
every metric the Grafana dashboard queries exists on the live gateway's ``/metrics``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.tools.engines import start_fake_upstream
from tests.tools.servers import RunningServer, free_port, gateway, start_process, stop_process

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "rules" / "llmso.rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "llmso.json"


def _require(binary: str) -> str:
    found = shutil.which(binary)
    if found is None:
        reason = f"{binary} is not installed (run `make prometheus`)"
        if os.environ.get("LLMSO_REQUIRE_ENGINES") == "1":
            raise RuntimeError(reason)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def live_gateway() -> Iterator[RunningServer]:
    with start_fake_upstream() as fake:
        port = fake.url.rsplit(":", 1)[1]
        model = {
            "name": "m",
            "backend": "openai",
            # Two spellings of one fake server: two replicas, so per-replica series exist.
            "replicas": [f"http://127.0.0.1:{port}/v1", f"http://localhost:{port}/v1"],
            "upstream_model": "fake-model",
            "health_interval": 0.5,
            "metrics_scrape_interval": 0.5,
        }
        with gateway({"models": [model]}) as running:
            for _ in range(3):
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                reply = httpx.post(running.url + "/v1/chat/completions", json=body, timeout=30)
                assert reply.status_code == 200, reply.text
            yield running


@pytest.fixture(scope="module")
def prometheus(live_gateway: RunningServer) -> Iterator[RunningServer]:
    binary = _require("prometheus")
    config: dict[str, Any] = yaml.safe_load((PROMETHEUS / "llmso.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(PROMETHEUS / path) for path in config["rule_files"]]
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "llmso")
    job["static_configs"][0]["targets"] = [live_gateway.url.removeprefix("http://")]
    with tempfile.TemporaryDirectory(prefix="llmso-prom-") as tmp:
        path = Path(tmp) / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        port = free_port()
        argv = [
            binary, f"--config.file={path}", f"--storage.tsdb.path={tmp}/data",
            f"--web.listen-address=127.0.0.1:{port}",
        ]  # fmt: skip
        server = start_process(argv, port=port, health_path="/-/ready", timeout=60, cwd=Path(tmp))
        try:
            yield server
        finally:
            stop_process(server)


def test_promtool_checks_config_and_rules() -> None:
    promtool = _require("promtool")
    for args, cwd in (
        (["check", "config", "llmso.yml"], PROMETHEUS),
        (["check", "rules", "rules/llmso.rules.yml"], PROMETHEUS),
        (["test", "rules", "llmso.rules.test.yml"], PROMETHEUS / "rules"),
    ):
        done = subprocess.run(
            [promtool, *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr


def _query(prometheus: RunningServer, expr: str) -> list[dict[str, Any]]:
    reply = httpx.get(prometheus.url + "/api/v1/query", params={"query": expr}, timeout=10)
    assert reply.status_code == 200, reply.text
    result: list[dict[str, Any]] = reply.json()["data"]["result"]
    return result


def test_prometheus_scrapes_the_gateway(prometheus: RunningServer) -> None:
    expr = 'sum(llmso_requests_total{model="m", status="ok"})'
    deadline = time.monotonic() + 30
    while not (result := _query(prometheus, expr)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert result and float(result[0]["value"][1]) == 3, result
    replicas = _query(prometheus, 'llmso_replica_up{model="m"}')
    assert len(replicas) == 2 and all(r["value"][1] == "1" for r in replicas), replicas
    rules = httpx.get(prometheus.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert {g["name"] for g in rules} == {"llmso-recording", "llmso-alerts"}
    assert all(rule["health"] != "err" for g in rules for rule in g["rules"]), rules


def _dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_every_dashboard_metric_exists_on_a_live_gateway(live_gateway: RunningServer) -> None:
    text = httpx.get(live_gateway.url + "/metrics", timeout=10).text
    served = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    served |= {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1].isalpha()}
    recorded = {
        rule["record"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for rule in g["rules"]
        if "record" in rule
    }
    exprs = _dashboard_exprs()
    assert len(exprs) > 20
    missing = set()
    names = {name for expr in exprs for name in re.findall(r"\b(llmso[a-z0-9_:]*)", expr)}
    assert len(names) > 25, names
    for name in names:
        if ":" in name:  # a recording rule: must be one we ship
            if name not in recorded:
                missing.add(name)
            continue
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        if family not in served and name not in served:
            missing.add(name)
    assert not missing, sorted(missing)
