"""Configuration: the YAML schema (``schema``), its loader (``loader``) and shipped files.

``default.yaml`` is the embedded default; ``examples/`` holds one file per backend.
"""
