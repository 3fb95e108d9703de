"""The OpenAI Responses API (``/v1/responses``) on the same backend contract as chat.

``wire`` parses the request, ``translate`` turns it into a ``GenerationRequest``,
``output`` and ``render`` build the response object and its stream events, ``store``
and ``redis_store`` keep finished responses for ``previous_response_id``, ``endpoint``
ties them to ``gateway.edge.call.EndpointCall`` and ``api`` serves GET/DELETE by id.
"""
