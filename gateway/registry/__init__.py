"""The multi-model registry: lifecycle, lazy loading, eviction, routing, hot reload.

Public surface: ``ModelRegistry`` (owned by the event loop), its value types, its typed
errors, ``RegistryMetrics`` and the ``ConfigWatcher`` for hot reload.
"""

from backends.factory import CrashHandler
from gateway.registry.entry import Backoff
from gateway.registry.errors import ModelNotFound, ModelOverloaded, ModelUnavailable
from gateway.registry.lifecycle import BackendFactory
from gateway.registry.model_metrics import RegistryMetrics
from gateway.registry.registry import ModelRegistry
from gateway.registry.reload import ConfigWatcher
from gateway.registry.routing import CAPABILITY_PREFIX
from gateway.registry.values import (
    ConfigDiff,
    Lease,
    ModelState,
    ModelStatus,
    RouteDecision,
)

__all__ = [
    "CAPABILITY_PREFIX",
    "BackendFactory",
    "Backoff",
    "ConfigDiff",
    "ConfigWatcher",
    "CrashHandler",
    "Lease",
    "ModelNotFound",
    "ModelOverloaded",
    "ModelRegistry",
    "ModelState",
    "ModelStatus",
    "ModelUnavailable",
    "RegistryMetrics",
    "RouteDecision",
]
