"""Process isolation for in-process engines: one worker process per model.

``ProcessBackend`` (backend.py) is the parent-side ``Backend``; it spawns a fresh
interpreter running ``worker.py``, which builds the real engine backend and relays
requests, events, errors and metrics over one Unix socket (``protocol.py``).
"""
