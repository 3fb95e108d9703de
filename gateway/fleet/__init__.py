"""Every core of a host: ``llmso serve --workers N`` (``server.workers``), N gateway
processes on one port under one supervisor (docs/workers.md).

- ``supervisor.py``: starts the workers, restarts a crashed one, drains all on SIGTERM;
- ``sockets.py``: one ``SO_REUSEPORT`` listener per worker on the shared port;
- ``hub.py``: the supervisor's UNIX socket the workers talk through (gather, broadcast,
  admin actions replayed to a restarted worker);
- ``link.py``: a worker's seat and its channel to the hub; ``wire.py``: the frames;
- ``stores.py``: the limit and Responses stores the hub serves when no Redis is set;
- ``metrics.py``: one ``/metrics`` from every worker's families.

The edge uses the link (``AppState.fleet``) for its fleet-wide views; nothing here
imports the edge.
"""
