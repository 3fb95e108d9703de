"""The built-in web console (``/ui``) and the JSON views it shares with scripts: what
they show.

``Console`` is what one app owns for them: the recent-requests ring and stats window
(``Activity``, fed by every finished request) and the engine gauges reader. The page
itself is plain ES modules and CSS under ``static/`` (``page`` reads them), served from
the package (no CDN, no build step). The routes are the edge's
(``gateway.edge.console_routes``): the console imports nothing above ``observe``.
"""

from __future__ import annotations

from backends.hop_metrics import BackendMetrics
from gateway.console.activity import Activity, RequestSummary
from gateway.console.gauges import NO_ENGINE_FIGURES, EngineGauges


class Console:
    """Owned by the app's event loop, like everything it holds."""

    def __init__(self, backend_metrics: BackendMetrics, activity: Activity | None = None) -> None:
        self.activity = activity or Activity()
        self.gauges = EngineGauges(backend_metrics, self.activity.window_seconds)


__all__ = ["NO_ENGINE_FIGURES", "Activity", "Console", "EngineGauges", "RequestSummary"]
