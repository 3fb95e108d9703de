"""The backend contract's hooks for the in-process engine, shared by every hf contract
class: it honours structured output, refuses more choices than ``max_num_seqs``, and
counts abandoned work in its observer (an ``observer`` fixture the test module gives)."""

from __future__ import annotations

import pytest

from backends.base import Backend, GenerationRequest
from tests.contract.backend_suite import BackendContract
from tests.hf.helpers import RecordingObserver


class EngineContract(BackendContract):
    """See the module docstring; ``spare`` must have ``max_queue=2``."""

    structured = True
    tokenizes = True

    flood = 5
    min_refused = 3  # max_queue=2: two wait, three are refused

    def invalid_request(self) -> GenerationRequest:
        return self.request(4, n=25, temperature=1.0)  # more choices than max_num_seqs

    async def aborted(self, backend: Backend) -> float:
        return float(self._observer.aborts)

    @pytest.fixture(autouse=True)
    def _keep_observer(self, observer: RecordingObserver) -> None:
        self._observer = observer
