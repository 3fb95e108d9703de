"""``llmso plan``: cost and latency decisions from measured ``llmso bench`` curves."""
