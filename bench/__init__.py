"""llmso bench: a load generator and comparison harness for OpenAI-compatible servers.

The load generator is a pure HTTP client; a few peers and probes reuse parts of the
product (``raw_relay`` the gateway's transport, ``client`` the proxy's request body), never
the reverse. Entry point: :func:`bench.cli.main` (``llmso bench ...``, a subcommand found
through the ``llmso.commands`` entry point, or ``python -m bench ...``).
"""
