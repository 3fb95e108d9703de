"""Access policy: which client keys may call, which models each may use, how much
(rate limits, parallel requests, daily token budgets) and what each used.

``admission`` is the decision every request passes once (``Admission``, one per app;
a ``Ticket`` per request), on ``keys`` (the key ring), ``limits`` (the arithmetic and the
in-process store), ``store`` (the store the config names, behind a timeout and failure
policy; ``redis_store`` when shared by replicas), ``metrics`` (per-key counters and
tallies) and ``usage`` (the ``/admin/usage`` report); ``errors`` are its refusals. No
HTTP here: the edge (``gateway.edge.door``) reads the request and renders the outcome.
"""
