"""Read Prometheus samples off a running server's ``/metrics`` page in end-to-end tests.

Counters are cumulative over the server's life, which earlier tests share: a test reads
a counter before its request and asserts by how much it grew, never that it is >= 1.
"""

from __future__ import annotations

import time

import httpx


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples in exposition ``text`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scrape(base_url: str) -> str:
    return httpx.get(base_url + "/metrics", timeout=10.0).text


def settled_value(
    base_url: str, name: str, at_least: float, within: float = 5.0, **labels: str
) -> float:
    """``name``'s value once it reached ``at_least`` (a request is counted when it
    finishes, which may be just after its client read the answer), or its value at the
    deadline; then read once more, so a late second count shows too."""
    deadline = time.monotonic() + within
    while metric_value(scrape(base_url), name, **labels) < at_least:
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    time.sleep(0.2)
    return metric_value(scrape(base_url), name, **labels)
