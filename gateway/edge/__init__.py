"""The HTTP edge: the ASGI entry point and its dispatch (``asgi``), one request's call
machinery (``call``: body limit, disconnect watch, errors), the coalescing transport, SSE
batching, graceful drain, and the operational routes (health, metrics, models, admin)."""
