"""LoRA adapters: which ones are resident (the pool) and the runner's stacked weights for
them (the bank).

- ``pool``: ``AdapterPool``: the adapters a model may serve (configured and added at run
  time), at most ``max_loras`` resident, one loaded on demand and pinned while requests
  use it. Owner: the backend's event loop.
- ``bank``: ``LoraBank``: the resident adapters' weights read from PEFT folders and
  stacked per fused projection, which add every adapter's delta to one packed step
  (``LoraStep``). Built off the engine thread and read-only; the engine thread moves the
  packed runner onto a new bank between steps.

The packed runner (``model.packed_runner``) holds a bank, and a bank builds its matmuls
with ``model.linears``: the two rooms import each other, with no cycle between modules.
"""
