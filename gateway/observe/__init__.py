"""What is known about each request: its record (timestamps, tokens, outcome), the
Prometheus families, tracing, the ``Server-Timing`` header, logs and ids."""
