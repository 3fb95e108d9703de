"""Getting a model into memory: where it comes from, how it loads, what it will cost.

- ``model_source``: a ``source`` (folder, ``package:``, GGUF file, hub id) resolved to
  what ``from_pretrained`` loads; a GGUF is converted once into a cache folder;
- ``loader``: ``load``, model and tokenizer on the configured device and dtype
  (``LoadedModel``), and ``ModelLoadError``;
- ``quantization``: ``quant_plan``, the config's ``quantization:`` as a ``QuantPlan``
  (each projection's width; for ``gguf`` read from the file's tensor types);
- ``memory_estimate``: the memory a model will take, before loading, from its weight
  files' headers (asked by the registry through ``backends.factory``);
- ``load_thread``: run a load on a thread of its own that exits when it returns, so its
  OpenMP pool goes with it.

Functions and frozen values, no state of their own in memory; loads are blocking and run
on worker threads under the process's load lock (``backends.process_wide``), never on
the event loop. Both backends (``backend``, ``embedding``) load through here.
"""
