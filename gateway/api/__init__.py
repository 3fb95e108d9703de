"""The public endpoints: ``chat``, ``completions``, ``embeddings``, ``responses/``
(OpenAI's Responses API) and ``messages/`` (Anthropic's Messages API and its token
count). Each parses its wire body into a typed frozen request, hands it to one service
call and presents the answer; ``base`` is the pattern they share (``Endpoint``,
``Prepared``, ``Presenter``). ``wire``, ``translate`` and ``tool_wire`` parse the chat and
completions bodies into ``backends.base`` types; ``prompt_scores`` renders a scored
prompt. ``gateway.app.build_app`` lists the endpoints, and the edge
(``gateway.edge.call.EndpointCall``) serves each."""
