"""The HTTP edge, everything that speaks ASGI (its types: ``asgi_types``): the entry
point and its dispatch (``asgi``), the front door's checks around every request (``door``
and ``web``: Host, method, Content-Type, client key, body deadline, CORS, rate-limit
headers; the policy behind them is ``gateway.access``), one request's call machinery
(``call``: body limit, disconnect watch, errors), the coalescing transport, SSE batching,
graceful drain, and the operational, admin and console routes (``ops``, ``adapters``,
``console_routes``)."""
