"""llmso bench: a load generator and comparison harness for OpenAI-compatible servers.

What ``llmso bench`` (``cli``) and ``llmso plan`` (``plan/``) run, and nothing else:

- one request, timed chunk by chunk (``client``), and load levels of them (``loadgen``);
- the comparison driver (``compare``) over a spec of systems (``spec``) started as
  subprocesses (``systems``), the built-in suites (``suites``, ``prefix_suite``,
  ``gpu_suite``; ``gpu.sh`` builds the CUDA venvs), the in-process ``transformers``
  reference they start (``reference``), prompts (``prompts``), statistics (``stats``),
  reports (``report``), machine notes (``machine``, ``kv_memory``) and server CPU
  (``procstat``);
- the upstream doubles the overhead suite starts: ``fake_upstream``, and the two floors
  it is compared against, ``raw_relay`` and ``bare_passthrough``.

The load generator is a pure HTTP client; a few parts reuse the product (``raw_relay``
the gateway's transport, ``client`` the proxy's request body), never the reverse. The
one-off studies behind docs/benchmarks/ live in ``bench.studies``, which the wheel leaves
out. Entry point: :func:`bench.cli.main` (``llmso bench ...``, a subcommand found through
the ``llmso.commands`` entry point, or ``python -m bench ...``).
"""
