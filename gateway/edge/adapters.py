"""Run-time LoRA adapters: ``POST``/``DELETE /admin/models/{base}/adapters``, and vLLM's
``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` shapes for tools written against
vLLM. All behind the admin key; the registry does the work (``add_adapter``), on every
worker of a fleet (``gateway.edge.admin_actions``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import PlainTextResponse, Response

from backends.errors import InvalidRequest
from gateway.api.base import parse_json
from gateway.edge.admin_actions import AdminAction, run_admin
from gateway.edge.ops import applied_response, require_admin

router = APIRouter()


class _AdapterBody(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    source: str | None = Field(None, min_length=1)
    aliases: tuple[str, ...] = ()


class _LoadBody(BaseModel):
    """vLLM's ``LoadLoRAAdapterRequest``; ``base_model_name`` is ours, needed only when
    more than one model serves adapters."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # vLLM adds fields over time

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    base_model_name: str | None = None


class _UnloadBody(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    lora_name: str = Field(min_length=1)


@router.post("/admin/models/{base}/adapters")
async def add_adapter(base: str, request: Request) -> Response:
    state = require_admin(request)
    body = parse_json(_AdapterBody, await request.body())
    action = AdminAction("add_adapter", base, body.name, body.source, body.aliases)
    return applied_response(await run_admin(state, action))


@router.delete("/admin/models/{base}/adapters/{name}")
async def remove_adapter(base: str, name: str, request: Request) -> Response:
    state = require_admin(request)
    return applied_response(await run_admin(state, AdminAction("remove_adapter", base, name)))


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> Response:
    state = require_admin(request)
    body = parse_json(_LoadBody, await request.body())
    base = body.base_model_name or _only_lora_model(state.registry.lora_models())
    await run_admin(state, AdminAction("add_adapter", base, body.lora_name, body.lora_path))
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> Response:
    state = require_admin(request)
    body = parse_json(_UnloadBody, await request.body())
    base = state.registry.adapter_base(body.lora_name)
    await run_admin(state, AdminAction("remove_adapter", base, body.lora_name))
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _only_lora_model(models: list[str]) -> str:
    if len(models) == 1:
        return models[0]
    which = ", ".join(models) if models else "none is configured"
    raise InvalidRequest(
        f"which base model? set base_model_name (models serving adapters: {which})",
        param="base_model_name",
    )
