"""Drills: long measurement runs against real servers, started by make targets, not by pytest.

``soak`` (``make soak``), ``failover_drill`` (``make failover-trials``, ``make
failover-seams``), ``batch_drill`` (``make batch-drill``) and ``lm_eval_drill`` (``make
eval-harness``): each runs as ``python -m tests.drills.NAME`` and writes its report under
``docs/``. Short runs of three of them are e2e tests (``tests/e2e/test_soak_short.py``,
``test_failover_llamacpp.py``, ``test_lm_eval_hf.py``).
"""
