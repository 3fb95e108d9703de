"""The public endpoints, one module each (``chat``, ``completions``, ``embeddings``,
``responses``): parse the wire body into a typed frozen request, hand it to one service
call, present the answer. ``base`` is the pattern they share; ``ENDPOINTS`` (in
``gateway.api.routes``) registers them."""
