"""The one owner of the process-wide state that loading a Transformers model touches.

Loading a model with ``from_pretrained`` changes state that every thread of the process
shares, for as long as the load runs (transformers 5.19, read from its source):

- ``torch.set_default_dtype(dtype)`` (``local_torch_dtype``), restored at the end: a
  second load that starts meanwhile restores the *first* load's dtype as "original"
  and can leave the process, or its own parameters, in the other model's dtype;
- ``PreTrainedModel.tie_weights`` replaced by a no-op (``no_tie_weights``): a model that
  finishes its load meanwhile skips tying, so a tied LM head stays on the meta device
  ("Cannot copy out of meta tensor");
- ``torch.linspace`` and other module attributes patched (``meta_device_safe_creation_ops``,
  ``apply_patches``);
- the lazy ``transformers`` module imports submodules on first attribute access; two
  threads importing at once see half-initialised modules (``ImportError: cannot import
  name 'PreTrainedTokenizerBase' from 'transformers'``). ``xgrammar`` imports
  transformers at its own import.

The device context (``with torch.device("meta")``) and OpenMP's thread count
(``torch.set_num_threads``) are per thread and need no guard.

So every construction of a model or tokenizer, and every *first* import of transformers
or xgrammar, happens while holding ``exclusive()``; the first holder imports the whole
stack before anything else, and the product's modules import neither at module level
(a test checks), so no import of them can start outside the lock. Loads therefore run
one at a time; serving never takes the lock, and the engines' forwards name their dtypes
explicitly, so a load running beside a serving engine cannot change its numbers (tested
with the default dtype flipped under a running engine).

Owner: this module; the lock is re-entrant (a load may convert a GGUF inside its own
load), and nothing else in the process changes the state listed above.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

_LOCK = threading.RLock()
_imported = False

# Imported on the first acquisition, in this order: transformers' lazy names resolve
# to submodules, and xgrammar (when installed) imports transformers at import time.
_STACK = (
    "transformers",
    "transformers.modeling_utils",
    "transformers.tokenization_utils_base",
    "transformers.cache_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
)
_NAMES = (
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoTokenizer",
    "AutoConfig",
    "DynamicCache",
    "PreTrainedTokenizerBase",
    "PreTrainedTokenizerFast",
)
_OPTIONAL = ("xgrammar",)


@contextmanager
def exclusive(what: str) -> Iterator[None]:
    """Hold the process's load lock while ``what`` constructs models or tokenizers.

    Restores torch's default dtype if the body left it changed (transformers restores
    it itself; a failure half-way must not leak a dtype into every later tensor)."""
    asked = time.perf_counter()
    with _LOCK:
        waited = time.perf_counter() - asked
        if waited > 0.05:
            log.info("%s waited %.1fs for another model's load to finish", what, waited)
        _import_stack()
        torch = sys.modules.get("torch")
        before = torch.get_default_dtype() if torch is not None else None
        try:
            yield
        finally:
            if torch is not None and before is not None and torch.get_default_dtype() != before:
                log.error("%s left torch's default dtype changed; restoring %s", what, before)
                torch.set_default_dtype(before)


def _import_stack() -> None:
    global _imported  # noqa: PLW0603 - set once, under _LOCK
    if _imported:
        return
    for name in _STACK:
        importlib.import_module(name)
    transformers = sys.modules["transformers"]
    for attr in _NAMES:
        getattr(transformers, attr)
    for name in _OPTIONAL:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    _imported = True
