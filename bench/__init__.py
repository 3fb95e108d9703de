"""llmso bench: a load generator and comparison harness for OpenAI-compatible servers.

A pure client: it never imports ``gateway`` or ``backends``. Entry point: :func:`bench.cli.main`
(``llmso bench ...`` or ``python -m bench ...``).
"""
