"""The embedding backend (``task: embed``), apart from the generation engine.

- ``backend``: ``HFEmbeddingBackend``: a pooling model on an engine thread of its own,
  which batches every waiting job's inputs by length;
- ``pooling``: a folder's sentence-transformers pooling and normalisation, and the
  pooling arithmetic.

It shares only ``loading`` (source, device, threads, the load thread) with the
generation engine; ``backends.factory`` builds it for a model with ``task: embed``.
"""
