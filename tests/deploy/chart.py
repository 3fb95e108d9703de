"""Helpers for the Helm chart tests: find the pinned Helm binary, render the chart, and the
policy every workload must pass. Kept apart from the tests so each piece reads alone."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "llmso"
VALUES_FILES = ("values.yaml", "values-cpu-demo.yaml", "values-gpu.yaml")
RELEASE = "llmso"
NAMESPACE = "llmso"
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


def helm_binary() -> str:
    """The project-local Helm (``make helm``), else one on PATH; skips where none can be."""
    local = REPO / ".tools" / "helm" / "helm"
    if local.is_file():
        return str(local)
    found = shutil.which("helm")
    if found is not None:
        return found
    system, machine = platform.system(), platform.machine()
    if (system, machine) != ("Linux", "x86_64"):
        pytest.skip(f"no pinned Helm binary for {system}/{machine} (mk/helm.mk: Linux/x86_64)")
    reason = "helm is not installed (run `make helm`)"
    if os.environ.get("LLMSO_REQUIRE_ENGINES") == "1":
        raise RuntimeError(reason)
    pytest.skip(reason)


class Helm:
    """Runs one Helm binary with its cache and config kept in ``home`` (not the user's)."""

    def __init__(self, binary: str, home: Path) -> None:
        self.binary = binary
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # the caller checks returncode: failures are tested
            [self.binary, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
        )

    def template(
        self, values: str, sets: Sequence[str] = (), kube_version: str = "1.32.0"
    ) -> subprocess.CompletedProcess[str]:
        args = ["template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(CHART / values)]
        args += ["--kube-version", kube_version]
        for item in sets:
            args += ["--set", item]
        return self.run(*args)

    def render(self, values: str, sets: Sequence[str] = ()) -> list[dict[str, Any]]:
        done = self.template(values, sets)
        assert done.returncode == 0, done.stderr
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def find(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(matches) == 1, (kind, name, [d["metadata"]["name"] for d in matches])
    return matches[0]


def policy_problems(doc: dict[str, Any]) -> list[str]:
    """What a workload manifest lacks; empty when it passes (non-workloads always pass):
    liveness and readiness probes, CPU and memory requests and limits, non-root, a
    read-only root filesystem, no privilege escalation."""
    if doc.get("kind") not in WORKLOADS:
        return []
    name = f"{doc['kind']}/{doc['metadata']['name']}"
    pod = doc["spec"]["template"]["spec"]
    pod_security = pod.get("securityContext") or {}
    problems = []
    for init, container in [(True, c) for c in pod.get("initContainers", [])] + [
        (False, c) for c in pod.get("containers", [])
    ]:
        where = f"{name}/{container['name']}"
        for probe in () if init else ("livenessProbe", "readinessProbe"):
            if not container.get(probe):
                problems.append(f"{where}: no {probe}")
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in (resources.get(kind) or {}):
                    problems.append(f"{where}: no {resource} in resources.{kind}")
        security = {**pod_security, **(container.get("securityContext") or {})}
        if not security.get("runAsNonRoot") or security.get("runAsUser", 1) == 0:
            problems.append(f"{where}: may run as root")
        if not security.get("readOnlyRootFilesystem"):
            problems.append(f"{where}: writable root filesystem")
        if security.get("allowPrivilegeEscalation", True):
            problems.append(f"{where}: allows privilege escalation")
    return problems


def pod_urls(
    docs: Sequence[dict[str, Any]], statefulset: dict[str, Any], scheme: str, port_name: str
) -> list[str]:
    """The per-pod addresses of a StatefulSet through its headless Service, derived from
    the manifests alone: ``<sts>-<i>.<service>.<namespace>.svc.cluster.local:<port>``."""
    spec = statefulset["spec"]
    service = find(docs, "Service", spec["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "per-pod DNS needs a headless Service"
    labels = spec["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items(), "Service selects other pods"
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == port_name)
    name, namespace = statefulset["metadata"]["name"], statefulset["metadata"]["namespace"]
    host = f"{spec['serviceName']}.{namespace}.svc.cluster.local:{port}"
    return [f"{scheme}{name}-{i}.{host}" for i in range(int(spec["replicas"]))]
