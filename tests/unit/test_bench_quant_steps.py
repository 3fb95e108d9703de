"""``bench.quant_steps``: its table names every measured point and the implied rate."""

from __future__ import annotations

import pytest

from bench.quant_steps import main, markdown


def test_the_table_has_a_column_per_row_count_and_prefill() -> None:
    rows = [
        {
            "setting": setting,
            "weights_mb": mb,
            "decode_ms": {"1": 10.0, "16": 40.0},
            "prefill_ms": {"128": 300.0},
            "decode_gmac_per_s": {"1": 100.0, "16": 400.0},
        }
        for setting, mb in (("none", 2000.0), ("int4", 900.0))
    ]
    meta = {
        "model": "m",
        "command": "python -m bench.quant_steps",
        "machine": {"cpu_model": "cpu", "cpus_usable": 2},
        "threads": 2,
        "started": "t",
    }
    text = markdown(rows, meta)
    header = next(line for line in text.splitlines() if line.startswith("| setting"))
    assert header.count("|") == 6  # setting, weights, 2 decode, 1 prefill
    assert "| int4 | 900 MB | 10.0 ms (100 GMAC/s) | 40.0 ms (400 GMAC/s) | 300 ms |" in text


def test_a_model_or_a_shape_is_required() -> None:
    with pytest.raises(SystemExit):
        main(["--out", "/tmp/unused"])
    with pytest.raises(SystemExit):
        main(["--out", "/tmp/unused", "--shape", "llama-3.2-1b"])  # no --tokenizer-from
