"""Upstream replicas shared by the remote backends (``openai``, ``triton``).

Transport-independent parts only:

- ``health``       probe hysteresis and the circuit breaker (pure state machines)
- ``balance``      the policies: least_loaded, prefix, round_robin (pure)
- ``scrape``       an engine's load from its Prometheus page (vLLM, Triton)
- ``replica``      ``Replica``: health, ejection, in-flight count and load of one address
- ``replica_set``  ``ReplicaSet``: the choice per attempt, background probes and
                   scrapes, in-place updates on hot reload
- ``attempts``     the retry walk: another replica before the first byte, then backoff
- ``adapters``     which replica holds which LoRA adapter; one load where none does
- ``metrics``      the per-replica Prometheus families
"""
