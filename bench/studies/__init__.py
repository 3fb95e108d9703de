"""One-off studies: the measurement drivers behind docs/benchmarks/, not part of llmso.

Each module here answers one question once (what quantized weights cost, how LoRA mixing
scales, which balance policy reuses the most cache, ...) and wrote one results folder
under ``docs/benchmarks/``; docs/benchmarks/README.md names every study with the command
that runs it. They are not shipped (the wheel leaves ``bench.studies`` out) and are run
from a checkout, ``python -m bench.studies.NAME``, with the repository's virtualenvs
(several start vLLM or llama.cpp from theirs). They may use the product's load generator
(``bench.client``, ``bench.compare``, ``bench.suites``) and the test doubles in
``tests/tools``; nothing in the product or in ``tests/`` imports them.
"""
