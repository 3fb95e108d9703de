"""The ``openai`` backend: a proxy to an OpenAI-compatible engine server.

Modules, from the wire inwards:

- ``engines``  what differs between vLLM, llama.cpp, mlx-lm and a generic server
- ``payload``  ``GenerationRequest`` -> upstream JSON body (pure)
- ``stream``   upstream SSE bytes -> ``BackendEvent`` values (pure, one per stream)
- ``errors``   upstream statuses and client exceptions -> ``BackendError``
- ``backend``  ``OpenAIProxyBackend``: the pooled client, limits, metrics; replicas,
               health, ejection and retries come from ``backends.replicas``
"""
