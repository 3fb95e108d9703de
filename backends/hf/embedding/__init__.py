"""The encoder backends (``task: embed`` and ``task: score``), apart from the generation
engine.

- ``backend``: ``HFEmbeddingBackend``: a pooling model on an engine thread of its own,
  which batches every waiting job's inputs by length; it also scores pairs by cosine;
- ``cross_encoder``: ``HFCrossEncoderBackend``: a one-label sequence classifier that
  scores pairs, batched the same way;
- ``jobs``: ``JobThread``, the engine thread and bounded inbox both share;
- ``pooling``: a folder's sentence-transformers pooling and normalisation, and the
  pooling arithmetic.

They share only ``loading`` (source, device, threads, the load thread) and ``tokenize``
with the generation engine; ``backends.factory`` builds them by ``task``.
"""
