"""Small pure pieces of the front door: Host parsing, loopback detection and the
presented key (``gateway.edge.web``), OpenAI's reset-duration format, the prompt
estimate (``gateway.access``) and the rate-limit headers (``gateway.edge.door``)."""

from __future__ import annotations

import pytest

from backends.base import ChatMessage, GenerationRequest, RequestKind, SamplingParams
from gateway.access.admission import estimate_prompt_tokens
from gateway.access.limits import Verdict, Window, openai_duration
from gateway.edge.door import rate_limit_headers
from gateway.edge.web import host_name, is_loopback, presented_key


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        (b"localhost:8000", "localhost"),
        (b"LocalHost", "localhost"),
        (b"[::1]:8000", "[::1]"),
        (b"[::1]", "[::1]"),
        (b"127.0.0.1", "127.0.0.1"),
        (b"evil.example:80", "evil.example"),
    ],
)
def test_host_name(raw: bytes, name: str) -> None:
    assert host_name(raw) == name


def test_is_loopback() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.1", "::", "example.com"))


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ([(b"authorization", b"Bearer sk-1 ")], b"sk-1"),
        ([(b"authorization", b"bearer sk-1")], b"sk-1"),
        ([(b"authorization", b"Basic abc"), (b"x-api-key", b"sk-2")], None),
        ([(b"authorization", b"Bearer ")], None),
        ([(b"api-key", b"sk-3"), (b"x-api-key", b"sk-4")], b"sk-3"),
        ([(b"x-api-key", b"sk-4")], b"sk-4"),
        ([(b"host", b"t")], None),
    ],
)
def test_presented_key(headers: list[tuple[bytes, bytes]], key: bytes | None) -> None:
    """Bearer first (another scheme presents nothing), then Azure's, then Anthropic's."""
    assert presented_key({"headers": headers}) == key


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.02, "20ms"), (1.5, "1.5s"), (6.0, "6s"), (360.0, "6m0s")]
)
def test_openai_duration(seconds: float, text: str) -> None:
    assert openai_duration(seconds) == text


def test_prompt_estimate_grows_with_the_prompt() -> None:
    def request(text: str) -> GenerationRequest:
        return GenerationRequest(
            request_id="r",
            model="m",
            kind=RequestKind.CHAT,
            sampling=SamplingParams(max_tokens=1),
            messages=(ChatMessage("user", text),),
        )

    short, long = estimate_prompt_tokens(request("hi")), estimate_prompt_tokens(request("x" * 400))
    assert 1 <= short < long and long >= 100


def test_rate_limit_headers() -> None:
    verdict = Verdict(True, requests=Window(60, 59, 1.0), tokens=Window(1000, 10, 0.5))
    assert dict(rate_limit_headers(verdict)) == {
        b"x-ratelimit-limit-requests": b"60",
        b"x-ratelimit-remaining-requests": b"59",
        b"x-ratelimit-reset-requests": b"1s",
        b"x-ratelimit-limit-tokens": b"1000",
        b"x-ratelimit-remaining-tokens": b"10",
        b"x-ratelimit-reset-tokens": b"500ms",
    }
