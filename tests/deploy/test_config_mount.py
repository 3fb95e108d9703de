"""A ``helm upgrade`` reaches a running gateway without a restart: the chart mounts its
ConfigMap as a folder, which the kubelet updates the way its atomic writer does (a new
timestamped folder, then the ``..data`` symlink swapped by rename; ``llmso.yaml`` is a
symlink through ``..data``). The gateway's real ConfigWatcher, on the path the Deployment
passes to ``--config``, must see that swap and apply the new ``replicas:`` list. (A
``subPath`` mount would pin the old inode forever; test_helm.py checks there is none.)"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from config.loader import load_config
from config.schema import OpenAIModelConfig
from gateway.registry import ConfigWatcher, ModelRegistry, RegistryMetrics
from tests.deploy.chart import Helm, find
from tests.tools.registry_fakes import FakeFactory, wait_until


def kubelet_write(folder: Path, files: dict[str, str]) -> None:
    """Project ``files`` into ``folder`` as the kubelet does for a ConfigMap volume."""
    folder.mkdir(exist_ok=True)
    version = folder / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.time_ns()}"
    version.mkdir()
    for name, text in files.items():
        (version / name).write_text(text)
    data, staged = folder / "..data", folder / "..data_tmp"
    old = data.resolve() if data.is_symlink() else None
    staged.symlink_to(version.name)
    os.replace(staged, data)  # the one atomic step
    for name in files:
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")
    if old is not None:
        shutil.rmtree(old)


def _config_map(helm: Helm, engines: int) -> dict[str, str]:
    docs = helm.render("values-gpu.yaml", [f"vllm.replicas={engines}"])
    data: dict[str, str] = find(docs, "ConfigMap", "llmso-config")["data"]
    return data


def _engine_urls(registry: ModelRegistry) -> tuple[str, ...]:
    model = next(m for m in registry.config.models if isinstance(m, OpenAIModelConfig))
    return model.upstream_urls


async def test_helm_upgrade_reaches_the_gateway_through_the_mounted_folder(
    helm: Helm, tmp_path: Path
) -> None:
    mount = tmp_path / "etc-llmso"  # the Deployment's mountPath, /etc/llmso
    kubelet_write(mount, _config_map(helm, engines=2))
    path = mount / "llmso.yaml"
    registry = ModelRegistry(load_config(path), RegistryMetrics(CollectorRegistry()), FakeFactory())
    await registry.start()
    watcher = ConfigWatcher(registry, path, interval=0.05)
    watcher.start()
    try:
        assert len(_engine_urls(registry)) == 2
        kubelet_write(mount, _config_map(helm, engines=3))  # helm upgrade --set vllm.replicas=3
        await wait_until(lambda: len(_engine_urls(registry)) == 3, within=10.0)
        assert watcher.reloads == 1 and watcher.rejected == 0
        assert _engine_urls(registry)[2].startswith("http://llmso-vllm-2.llmso-vllm-headless.")
    finally:
        await watcher.stop()
        await registry.stop()
