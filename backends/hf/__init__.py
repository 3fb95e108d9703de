"""The in-process Transformers engine (``backend: hf``), in rooms by concern.

A generation request's path through them:

1. ``backend.HFBackend`` (the event loop): the admission bound, a grammar compiled on a
   worker thread (``constrained``), a LoRA adapter pinned (``adapters``), then the
   request into the engine's inbox; its events come back as an async stream.
2. ``engine`` (the engine thread): ``Engine`` tokenizes and admits it; the scheduler
   (``ContinuousScheduler``, or ``StaticScheduler`` under ``scheduling: static``) packs
   each step; ``sampler`` picks the tokens; ``outputs`` and ``detokenizer`` turn them
   into events.
3. ``model``: the step's forward: the packed ``DecoderRunner``, or the ``ModuleRunner``
   for other decoders, over the slot KV cache and the prefix cache.

Once per load: ``loading`` resolves the source and loads weights and tokenizer, then
``assemble.assemble`` builds the engine's parts (grammar book, thought markup, adapter
pool, runner, prefix cache, the scheduler's constructor, the memory the registry counts).

The rooms:

- ``backend.py``: ``HFBackend``, the event-loop face (``Backend`` protocol);
- ``assemble.py``: ``assemble``, the engine's parts for one loaded model;
- ``engine/``: the engine loop: engine thread, schedulers, sequences, sampling, outputs;
- ``model/``: runners, families, linears, norms, attention, KV and prefix caches;
- ``loading/``: model sources, loading, quantization plans, the memory estimate;
- ``adapters/``: LoRA: the adapter pool and the runner's stacked bank;
- ``constrained/``: grammars and closing a constrained value within ``max_tokens``;
- ``embedding/``: ``HFEmbeddingBackend`` (``task: embed``) and ``HFCrossEncoderBackend``
  (``task: score``), backends with their own engine thread; they share ``loading`` and
  ``tokenize``;
- ``tokenize.py``: ``ModelTokenizer``, /tokenize and /detokenize on a copy of a model's
  tokenizer, for every hf backend.

Imports point down: ``backend`` -> ``assemble`` -> ``engine`` -> ``model`` and
``constrained``; ``model`` -> ``loading``. ``adapters`` sits beside ``model`` (the packed
runner holds a bank, which computes with ``model.linears``). ``backends.factory`` is the
entry point that builds either backend.
"""
