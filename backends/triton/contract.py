"""The tensor contract between the gateway and a Triton LLM model, in one place.

It is the contract of Triton's own vLLM backend (triton-inference-server/vllm_backend,
``src/model.py``), so one gateway config works against this repository's CPU ``llm``
model, Triton + vLLM, or any model that speaks the same tensors:

inputs   ``text_input`` BYTES[1]; ``stream`` BOOL[1]; ``sampling_parameters`` BYTES[1]
         (JSON: max_tokens, temperature, top_p, top_k, seed, stop, ...,
         ``structured_outputs``: json / json_object / structural_tag); optional
         ``exclude_input_in_output``, ``return_finish_reason``, ``return_num_input_tokens``,
         ``return_num_output_tokens`` BOOL[1]
outputs  ``text_output`` BYTES (the new text of each streamed response); optional
         ``finish_reason`` BYTES, ``num_input_tokens`` UINT32, ``num_output_tokens`` UINT32

The optional tensors are used only when the model's metadata declares them; otherwise the
backend falls back to its tokenizer for counts and to ``max_tokens`` for the reason.
Pure functions over plain data; the gRPC calls live in ``backend.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import InferInput, InferResult

from backends.base import FinishReason, SamplingParams
from backends.errors import ContractMismatch

TEXT_INPUT = "text_input"
STREAM = "stream"
SAMPLING_PARAMETERS = "sampling_parameters"
EXCLUDE_INPUT = "exclude_input_in_output"
RETURN_FINISH_REASON = "return_finish_reason"
RETURN_NUM_INPUT_TOKENS = "return_num_input_tokens"
RETURN_NUM_OUTPUT_TOKENS = "return_num_output_tokens"

TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"

REQUIRED_INPUTS = {TEXT_INPUT: "BYTES", STREAM: "BOOL", SAMPLING_PARAMETERS: "BYTES"}
OPTIONAL_INPUTS = {
    EXCLUDE_INPUT: "BOOL",
    RETURN_FINISH_REASON: "BOOL",
    RETURN_NUM_INPUT_TOKENS: "BOOL",
    RETURN_NUM_OUTPUT_TOKENS: "BOOL",
}
REQUIRED_OUTPUTS = {TEXT_OUTPUT: "BYTES"}
OPTIONAL_OUTPUTS = {FINISH_REASON: "BYTES", NUM_INPUT_TOKENS: "UINT32", NUM_OUTPUT_TOKENS: "UINT32"}

# The flag input that asks for each optional output.
_ASK_FOR = {
    FINISH_REASON: RETURN_FINISH_REASON,
    NUM_INPUT_TOKENS: RETURN_NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS: RETURN_NUM_OUTPUT_TOKENS,
}


@dataclass(frozen=True, slots=True)
class ModelContract:
    """What one Triton model declares beyond the required tensors."""

    inputs: frozenset[str]
    outputs: frozenset[str]

    def flags(self) -> tuple[str, ...]:
        """Optional ``return_*`` inputs to set: those whose output the model also has."""
        return tuple(
            flag
            for output, flag in _ASK_FOR.items()
            if output in self.outputs and flag in self.inputs
        )


@dataclass(frozen=True, slots=True)
class Chunk:
    """One streamed response, decoded. ``final`` is Triton's last-response mark."""

    text: str
    final: bool
    finish_reason: str | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None


def check_metadata(model: str, metadata: Mapping[str, Any]) -> ModelContract:
    """Validate ``get_model_metadata(as_json=True)``; raise ContractMismatch naming
    every difference, so the operator sees the whole problem at once."""
    declared_in = _tensors(metadata.get("inputs", ()))
    declared_out = _tensors(metadata.get("outputs", ()))
    problems = [
        *_compare("input", declared_in, REQUIRED_INPUTS, OPTIONAL_INPUTS),
        *_compare("output", declared_out, REQUIRED_OUTPUTS, OPTIONAL_OUTPUTS),
    ]
    if problems:
        raise ContractMismatch(
            f"Triton model {model!r} does not speak the LLM tensor contract "
            f"(vLLM backend style): {'; '.join(problems)}. "
            f"It declares inputs {_describe(declared_in)} and outputs {_describe(declared_out)}."
        )
    return ModelContract(
        inputs=frozenset(n for n in declared_in if n in OPTIONAL_INPUTS),
        outputs=frozenset(n for n in declared_out if n in OPTIONAL_OUTPUTS),
    )


def _tensors(entries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {str(e.get("name")): str(e.get("datatype")) for e in entries}


def _compare(
    kind: str, declared: Mapping[str, str], required: Mapping[str, str], optional: Mapping[str, str]
) -> list[str]:
    problems = [
        f"missing {kind} {name!r} ({dtype})"
        for name, dtype in required.items()
        if name not in declared
    ]
    for name, dtype in {**required, **optional}.items():
        if name in declared and declared[name] != dtype:
            problems.append(f"{kind} {name!r} is {declared[name]}, expected {dtype}")
    return problems


def _describe(tensors: Mapping[str, str]) -> str:
    return "[" + ", ".join(f"{n}:{t}" for n, t in tensors.items()) + "]"


def sampling_json(sampling: SamplingParams, structured: Mapping[str, Any] | None = None) -> str:
    """``sampling_parameters`` in vLLM's names. top_k off is -1, which every vLLM takes.

    ``structured`` (``tool_markup.constraints.structured_outputs``) travels as vLLM's
    ``structured_outputs`` key, a JSON string as Triton's vLLM backend expects it."""
    params: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
    }
    if sampling.max_tokens is not None:  # else the model's own default applies
        params["max_tokens"] = sampling.max_tokens
    if sampling.seed is not None:
        params["seed"] = sampling.seed
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.presence_penalty:
        params["presence_penalty"] = sampling.presence_penalty
    if sampling.frequency_penalty:
        params["frequency_penalty"] = sampling.frequency_penalty
    if sampling.ignore_eos:
        params["ignore_eos"] = True
    if structured:
        params["structured_outputs"] = json.dumps(structured)
    return json.dumps(params)


def build_inputs(
    text: str,
    sampling: SamplingParams,
    contract: ModelContract,
    structured: Mapping[str, Any] | None = None,
) -> list[InferInput]:
    """The input tensors of one streaming generation request."""
    inputs = [
        _bytes_input(TEXT_INPUT, text),
        _bool_input(STREAM, True),
        _bytes_input(SAMPLING_PARAMETERS, sampling_json(sampling, structured)),
    ]
    if EXCLUDE_INPUT in contract.inputs:
        inputs.append(_bool_input(EXCLUDE_INPUT, True))
    inputs += [_bool_input(flag, True) for flag in contract.flags()]
    return inputs


def _bytes_input(name: str, value: str) -> InferInput:
    tensor = InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value.encode("utf-8")], dtype=np.object_))
    return tensor


def _bool_input(name: str, value: bool) -> InferInput:
    tensor = InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value], dtype=np.bool_))
    return tensor


def parse_result(result: InferResult) -> Chunk:
    """Decode one streamed response. Text may arrive split in several elements."""
    response = result.get_response()
    names = {output.name for output in response.outputs}
    final_param = response.parameters.get("triton_final_response")
    final = bool(final_param.bool_param) if final_param is not None else False
    text = ""
    if TEXT_OUTPUT in names:
        text = "".join(_as_str(v) for v in result.as_numpy(TEXT_OUTPUT).reshape(-1))
    reason = None
    if FINISH_REASON in names:
        values = result.as_numpy(FINISH_REASON).reshape(-1)
        reason = _as_str(values[0]) if len(values) else None
    return Chunk(
        text=text,
        final=final,
        finish_reason=reason or None,
        num_input_tokens=_as_int(result, NUM_INPUT_TOKENS, names),
        num_output_tokens=_as_int(result, NUM_OUTPUT_TOKENS, names),
    )


def _as_str(value: object) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _as_int(result: InferResult, name: str, names: set[str]) -> int | None:
    if name not in names:
        return None
    values = result.as_numpy(name).reshape(-1)
    return int(values.sum()) if len(values) else None


def finish_reason(
    reported: str | None, completion_tokens: int, max_tokens: int | None
) -> FinishReason:
    """The model's reason when it says stop/length; else inferred from the token count."""
    if reported in ("stop", "length"):
        return "length" if reported == "length" else "stop"
    return "length" if max_tokens is not None and completion_tokens >= max_tokens else "stop"
