"""Print the gateway's ``replicas:`` list for the engine StatefulSets of an overlay.

    python deploy/k8s/replicas.py deploy/k8s/overlays/gpu

Renders the overlay with ``kubectl kustomize`` and, for every StatefulSet whose
``serviceName`` is a headless Service of the same overlay, lists one base URL per pod:
``http://<statefulset>-<i>.<service>:<port>/v1``. Paste the output under the model's
``replicas:`` in the overlay's ``llmso.yaml`` after changing the engine count; the test
suite (tests/unit/test_deploy_k8s.py) fails while the two disagree.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from typing import Any

import yaml


def render(overlay: str) -> list[dict[str, Any]]:
    """Every manifest ``kubectl kustomize`` renders for ``overlay``."""
    out = subprocess.run(
        ["kubectl", "kustomize", overlay], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def replica_urls(manifests: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """``{statefulset name: [base URL per pod]}`` for StatefulSets behind headless Services."""
    docs = list(manifests)
    headless = {
        doc["metadata"]["name"]: doc["spec"]
        for doc in docs
        if doc.get("kind") == "Service" and doc["spec"].get("clusterIP") == "None"
    }
    result: dict[str, list[str]] = {}
    for doc in docs:
        if doc.get("kind") != "StatefulSet":
            continue
        service = headless.get(doc["spec"].get("serviceName", ""))
        if service is None:
            continue
        name = doc["metadata"]["name"]
        port = service["ports"][0]["port"]
        count = int(doc["spec"].get("replicas", 1))
        host = doc["spec"]["serviceName"]
        result[name] = [f"http://{name}-{i}.{host}:{port}/v1" for i in range(count)]
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for name, urls in replica_urls(render(argv[0])).items():
        print(f"# {name}")
        print(yaml.safe_dump({"replicas": urls}, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
