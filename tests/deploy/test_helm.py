"""Offline checks of the Helm chart (deploy/helm/llmso) with the pinned Helm (``make
helm``): ``helm lint --strict`` and ``helm template`` with every values file; every
manifest validates against the Kubernetes schemas (``kubernetes-validate``, strict:
unknown fields fail) of the oldest and newest versions the chart targets, CRD objects
are checked for shape; every workload passes the policy (tests/deploy/chart.py), and the
policy is shown to fail on broken manifests. The rendered gateway config loads with
llmso's own loader, its ``replicas:`` has one URL per engine pod, the drain settings and
the config mount agree with the Deployment, and the HPA's metrics are ones the shipped
prometheus-adapter rules serve."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from config.loader import load_config
from config.schema import AppConfig, OpenAIModelConfig, TritonModelConfig
from tests.deploy.chart import (
    CHART,
    REPO,
    VALUES_FILES,
    Helm,
    find,
    pod_urls,
    policy_problems,
)

KUBE_VERSIONS = ("1.27.0", "1.35.0")  # Chart.yaml kubeVersion >=1.27; Helm 4.1's client
RULES = REPO / "deploy" / "prometheus" / "rules" / "llmso.rules.yml"
ADAPTER_VALUES = CHART / "files" / "prometheus-adapter-values.yaml"
Docs = list[dict[str, Any]]


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> dict[str, Docs]:
    return {values: helm.render(values) for values in VALUES_FILES}


def _config(docs: Docs, tmp_path: Path) -> AppConfig:
    """The rendered ConfigMap's llmso.yaml, through the project's loader (as the pod does)."""
    config_map = find(docs, "ConfigMap", "llmso-config")
    path = tmp_path / "llmso.yaml"
    path.write_text(config_map["data"]["llmso.yaml"])
    return load_config(path)


def _validate(docs: Docs) -> None:
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            _crd_shape(doc)  # prometheus-operator CRDs: no schema bundled, check the shape
        else:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
        assert not policy_problems(doc), policy_problems(doc)


def _crd_shape(doc: dict[str, Any]) -> None:
    spec = doc["spec"]
    if doc["kind"] == "ServiceMonitor":
        assert spec["selector"]["matchLabels"], doc
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
            assert endpoint["port"] and endpoint["path"].startswith("/"), endpoint
    else:
        assert doc["kind"] == "PrometheusRule", doc["kind"]
        assert spec == yaml.safe_load(RULES.read_text()), "not the rules Prometheus loads"


@pytest.mark.parametrize("values", VALUES_FILES)
def test_lint_strict(helm: Helm, values: str) -> None:
    done = helm.run("lint", "--strict", str(CHART), "-f", str(CHART / values))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_every_values_file_renders_and_validates(rendered: dict[str, Docs]) -> None:
    for values, docs in rendered.items():
        kinds = {doc["kind"] for doc in docs}
        assert {"Deployment", "Service", "ConfigMap"} <= kinds, values
        _validate(docs)
    gpu = {doc["kind"] for doc in rendered["values-gpu.yaml"]}
    assert {"StatefulSet", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= gpu
    assert {"ServiceMonitor", "PrometheusRule"} <= gpu
    demo = rendered["values-cpu-demo.yaml"]
    assert {d["kind"] for d in demo} == {"Deployment", "Service", "ConfigMap"}


def test_policy_check_fails_on_bad_manifests(rendered: dict[str, Docs]) -> None:
    gateway = find(rendered["values-gpu.yaml"], "Deployment", "llmso-gateway")
    assert not policy_problems(gateway)
    Break = Callable[[dict[str, Any], dict[str, Any]], object]
    breakages: list[tuple[Break, str]] = [
        (lambda c, p: c.pop("livenessProbe"), "no livenessProbe"),
        (lambda c, p: c.pop("readinessProbe"), "no readinessProbe"),
        (lambda c, p: c["resources"]["limits"].pop("memory"), "no memory in resources.limits"),
        (lambda c, p: c["resources"]["requests"].pop("cpu"), "no cpu in resources.requests"),
        (lambda c, p: c["securityContext"].update(runAsUser=0), "may run as root"),
        (lambda c, p: (c["securityContext"].pop("runAsNonRoot"), p.pop("securityContext")), "root"),
        (lambda c, p: c["securityContext"].pop("readOnlyRootFilesystem"), "writable root"),
        (lambda c, p: c["securityContext"].pop("allowPrivilegeEscalation"), "escalation"),
    ]
    for breakage, expected in breakages:
        broken = copy.deepcopy(gateway)
        pod = broken["spec"]["template"]["spec"]
        breakage(pod["containers"][0], pod)
        problems = policy_problems(broken)
        assert any(expected in problem for problem in problems), (expected, problems)
        assert len(problems) == 1, problems  # only what was broken
    bare = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "bare"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }
    assert len(policy_problems(bare)) == 2 + 4 + 3


def test_gateway_probes_drain_and_config_mount(rendered: dict[str, Docs], tmp_path: Path) -> None:
    for values, docs in rendered.items():
        config = _config(docs, tmp_path)
        pod = find(docs, "Deployment", "llmso-gateway")["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["livenessProbe"]["httpGet"]["path"] == "/health", values
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready", values
        # preStop starts the drain and holds the kubelet's SIGTERM for drain_grace; the
        # grace period covers drain_grace + drain_timeout.
        command = container["lifecycle"]["preStop"]["exec"]["command"][-1]
        assert command == f"kill -TERM 1; sleep {math.ceil(config.server.drain_grace)}"
        drain = config.server.drain_grace + config.server.drain_timeout
        assert pod["terminationGracePeriodSeconds"] >= drain + 5, values
        assert config.server.drain_grace > 0 and config.server.host == "0.0.0.0"
        # Hot reload: the ConfigMap is mounted as a folder (subPath mounts never update)
        # holding the file the gateway is told to read and watch.
        volume = next(v for v in pod["volumes"] if v.get("configMap"))
        assert volume["configMap"]["name"] == "llmso-config"
        mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
        assert "subPath" not in mount and "subPathExpr" not in mount
        config_arg = container["args"][container["args"].index("--config") + 1]
        assert Path(config_arg) == Path(mount["mountPath"]) / "llmso.yaml"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["LLMSO_WATCH_CONFIG"] == "true"
        port = next(p for p in container["ports"] if p["name"] == "http")["containerPort"]
        assert port == config.server.port


@pytest.mark.parametrize("count", [1, 3])
def test_replicas_list_has_one_url_per_engine_pod(helm: Helm, count: int, tmp_path: Path) -> None:
    docs = helm.render("values-gpu.yaml", [f"vllm.replicas={count}"])
    _validate(docs)
    engine = find(docs, "StatefulSet", "llmso-vllm")
    assert engine["spec"]["replicas"] == count
    model = next(m for m in _config(docs, tmp_path).models if isinstance(m, OpenAIModelConfig))
    assert model.engine == "vllm"
    expected = [url + "/v1" for url in pod_urls(docs, engine, "http://", "http")]
    assert list(model.upstream_urls) == expected and len(expected) == count
    container = engine["spec"]["template"]["spec"]["containers"][0]
    assert f"--served-model-name={model.name}" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_shared_store_for_many_gateways(
    helm: Helm, rendered: dict[str, Docs], tmp_path: Path
) -> None:
    for values in ("values.yaml", "values-gpu.yaml"):
        docs = rendered[values]
        service = find(docs, "Service", "llmso-redis")
        assert service["spec"]["ports"][0]["port"] == 6379
        url = f"redis://llmso-redis.{service['metadata']['namespace']}.svc.cluster.local:6379/0"
        config = _config(docs, tmp_path)
        assert config.limits.store == url and config.responses.store is None  # follows limits
    demo = rendered["values-cpu-demo.yaml"]
    assert find(demo, "Deployment", "llmso-gateway")["spec"]["replicas"] == 1
    assert _config(demo, tmp_path).limits.store == "memory"
    # Many gateways and nothing shared: refused, naming the fix.
    refused = helm.template("values-gpu.yaml", ["redis.enabled=false"])
    assert refused.returncode != 0 and "shared store" in refused.stderr
    external = helm.render("values-gpu.yaml", ["sharedStore.url=redis://redis.infra:6379/2"])
    assert not [d for d in external if d["metadata"]["name"] == "llmso-redis"]
    assert _config(external, tmp_path).limits.store == "redis://redis.infra:6379/2"


def test_hpa_metrics_are_served_by_the_adapter_rules(helm: Helm, rendered: dict[str, Docs]) -> None:
    shipped = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    served = {rule["name"]["as"] for rule in shipped}
    queue = helm.render("values.yaml", ["gateway.autoscaling.workerQueuePerPod=8"])
    _validate(queue)
    metrics = find(queue, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert {"type": "AverageValue", "averageValue": "8"} in [
        m.get("pods", {}).get("target") for m in metrics
    ]
    for values, docs in {**rendered, "queue depth": queue}.items():
        adapter = [d for d in docs if d["metadata"]["name"].endswith("prometheus-adapter-rules")]
        for config_map in adapter:  # the ConfigMap is rendered from the same file
            assert yaml.safe_load(config_map["data"]["config.yaml"]) == {"rules": shipped}
        for hpa in (d for d in docs if d["kind"] == "HorizontalPodAutoscaler"):
            pods = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if "pods" in m]
            assert "llmso_inflight_requests" in pods, values
            assert set(pods) <= served, (values, pods)


def test_triton_is_optional_and_wired(helm: Helm, tmp_path: Path) -> None:
    for count in (1, 2):
        docs = helm.render("values-gpu.yaml", ["triton.enabled=true", f"triton.replicas={count}"])
        _validate(docs)
        server = find(docs, "StatefulSet", "llmso-triton")
        models = _config(docs, tmp_path).models
        model = next(m for m in models if isinstance(m, TritonModelConfig))
        assert [e.url for e in model.endpoints] == pod_urls(docs, server, "", "grpc")
        assert len(model.endpoints) == count
        metrics_port = next(
            p["port"]
            for p in find(docs, "Service", "llmso-triton-headless")["spec"]["ports"]
            if p["name"] == "metrics"
        )
        assert model.metrics_port == metrics_port


def test_values_schema_refuses_typos_and_bad_types(helm: Helm) -> None:
    for bad, message in (
        ("vllm.replica=3", "'replica' not allowed"),
        ("vllm.replicas=two", "want integer"),
        ("gateway.drain.grace=-1", "minimum"),
        ("sharedStore.url=http://cache:6379", "does not match pattern"),
    ):
        refused = helm.template("values.yaml", [bad])
        assert refused.returncode != 0 and message in refused.stderr, (bad, refused.stderr)
