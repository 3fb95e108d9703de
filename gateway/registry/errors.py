"""The registry's errors, kept importable here; they live in ``backends.errors``.

``ModelUnavailable`` is ``NotReady`` and ``ModelOverloaded`` is ``Overloaded``: one class
per meaning, the old names stay as aliases.
"""

from __future__ import annotations

from backends.errors import ModelNotFound, NotReady, Overloaded

ModelUnavailable = NotReady
ModelOverloaded = Overloaded

__all__ = ["ModelNotFound", "ModelOverloaded", "ModelUnavailable"]
