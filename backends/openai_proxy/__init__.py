"""The ``openai`` backend: a proxy to an OpenAI-compatible engine server.

Modules, from the wire inwards:

- ``engines``  what differs between vLLM, llama.cpp, mlx-lm and a generic server
- ``payload``  ``GenerationRequest`` -> upstream JSON body (pure)
- ``stream``   upstream SSE bytes -> ``BackendEvent`` values (pure, one per stream)
- ``errors``   upstream statuses and client exceptions -> ``BackendError``
- ``http1``    the data path's lean HTTP/1.1 keep-alive client (generation streams)
- ``relay``    one upstream stream: open, read, translate; unhiding an empty stream's error
- ``embeddings`` the ``/v1/embeddings`` relay's body and answer
- ``rerank``   the ``/score`` and ``/rerank`` relay's bodies and answers
- ``tokenize`` the ``/tokenize`` and ``/detokenize`` relay's bodies and answers
- ``slots``    ``max_concurrency`` slots with a bounded wait
- ``probes``   health probes and what the upstream says about itself (model id, context)
- ``backend``  ``OpenAIProxyBackend``: lifecycle and the request path over the above;
               replicas, ejection and retries come from ``backends.replicas``
"""
