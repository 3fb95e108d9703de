"""Constrained decoding: a grammar masks each constrained choice's logits, and a closing
keeps its value able to end within ``max_tokens``.

- ``grammar``: ``GrammarBook`` compiles (xgrammar) a request's ``response_format`` or
  forced tool call, keeping the recent ones; each constrained choice gets its own
  matcher; ``mask_rows`` masks the sampler's rows;
- ``closing``: ``Closer`` and ``ClosingGuard`` (``close_json_by_budget``): the bytes
  that complete the value from the matcher's state, forced once the tokens left would
  not fit more; the choice then finishes ``closed_by_budget``.

A reasoning model's choice thinks first: the engine (``engine.sampler``,
``engine.outputs``) feeds its matcher from the answer's first token only, and closes the
thought while the shortest value still fits.

"Budget" in this room is always a request's ``max_tokens``; memory budgets are counted
in ``backends.hf.assemble`` and ``loading.memory_estimate``.

Owner: the backend creates the book and compiles on worker threads (the cache is
locked); matchers and guards belong to the engine thread.
"""
