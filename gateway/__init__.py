"""The HTTP edge: OpenAI-compatible routes, the completion service, the model registry
and the gateway's metrics. ``gateway.app.build_app`` assembles them."""
