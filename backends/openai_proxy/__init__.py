"""The ``openai`` backend: a proxy to an OpenAI-compatible engine server.

Modules, from the wire inwards:

- ``engines``  what differs between vLLM, llama.cpp, mlx-lm and a generic server
- ``payload``  ``GenerationRequest`` -> upstream JSON body (pure)
- ``stream``   upstream SSE bytes -> ``BackendEvent`` values (pure, one per stream)
- ``errors``   upstream statuses and client exceptions -> ``BackendError``
- ``health``   probe hysteresis and the circuit breaker (pure state machines)
- ``backend``  ``OpenAIProxyBackend``: the pooled client, retries, limits, metrics
"""
