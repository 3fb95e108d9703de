"""The Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``):
wire types, translation to the backend contract, and the Message / stream rendering."""
