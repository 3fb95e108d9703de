"""The engine loop: one thread per model takes requests in, schedules each step, samples
and emits the step's events.

- ``engine``: ``Engine``, the thread: intake (chat template, tokenization, context
  check), aborts, the step loop, failed steps and crashes; ``StepPolicy``, what a
  scheduling mode implements;
- ``scheduler``: ``ContinuousScheduler``, iteration-level scheduling over the slot KV
  cache (``continuous``; ``sequential`` is the same loop admitting one request at a time);
- ``static_scheduler``: ``StaticScheduler`` (``scheduling: static``): padded batches run
  to completion with transformers' own forward, no slot cache;
- ``waiting``: the continuous scheduler's waiting queue (priority, arrival, aging) and
  ``shed_limit``, the backend's bound per priority;
- ``sequence``: ``RequestState`` and ``Choice``, one request's and each choice's state;
- ``sampler``: the next token of every row of a step (grammar masks, closing guards,
  a thought's forced closing);
- ``prompt_scores``: prompt log-probabilities from the logits a prefill computes;
- ``outputs``: tokens into events (EOS, stop strings, length, the thought apart from
  the answer, usage);
- ``thought``: a reasoning model's thought: the markup resolved at load, and per choice
  the parser, the phase its grammar follows, its reasoning tokens, a forced closing;
- ``detokenizer``: incremental detokenization, stop strings across tokens, ``TokenTable``.

Owner: the engine thread owns everything built here once the engine runs (the
scheduler, its runner, every ``RequestState``); other threads reach it only through
``Engine.inbox``, ``Engine.aborts`` and ``Engine.between_steps``.
"""
