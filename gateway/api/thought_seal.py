"""Thoughts handed to a client in a form only this deployment accepts back.

A reasoning model's thought goes back into the next turn's prompt. Two APIs let a
stateless client carry it: the Responses API's ``encrypted_content`` (asked with
``include: ["reasoning.encrypted_content"]``) and the Messages API's thinking block
``signature``. Both are the same sealed string: the thought (base64url JSON) and an
HMAC-SHA256 of it under the deployment's key (``server.reasoning_secret``); signed, not
encrypted, since the client has the text anyway. The gateway takes back only thoughts
it produced: a forged seal, or a thinking block whose text differs from its seal, is a
400 naming the field. A seal alone is enough to restore a thought whose text the client
never saw (Anthropic's ``display: omitted``).

The key is fixed at ``build_app`` and read-only afterwards. Without a configured one a
random key is made per process: a thought then comes back only to the process that made
it (set one where replicas or restarts share conversations).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

import orjson

from backends.base import InvalidRequest

_DOMAIN = b"llmso-thought-v1\x00"
_VERSION = 1


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ThoughtSeal:
    """Signs thoughts and checks them (see the module doc)."""

    __slots__ = ("_key",)

    def __init__(self, secret: str | None) -> None:
        self._key = secret.encode() if secret else secrets.token_bytes(32)

    def _mac(self, body: bytes) -> str:
        return _b64(hmac.new(self._key, _DOMAIN + body, hashlib.sha256).digest())

    def seal(self, thought: str) -> str:
        """The thought and its signature, in one opaque string."""
        body = orjson.dumps({"v": _VERSION, "thought": thought})
        return f"{_b64(body)}.{self._mac(body)}"

    def open(self, sealed: str, param: str) -> str:
        """The thought of a ``seal``ed string; ``InvalidRequest`` naming ``param`` when it
        is malformed, forged or changed."""
        encoded, _, mac = sealed.partition(".")
        thought = None
        try:
            body = _unb64(encoded)
            if hmac.compare_digest(self._mac(body), mac):
                value = orjson.loads(body)
                thought = value["thought"] if value.get("v") == _VERSION else None
        except (ValueError, TypeError, KeyError, AttributeError):
            thought = None
        if not isinstance(thought, str):
            raise InvalidRequest(
                "this thought was not produced by this deployment, or was changed", param=param
            )
        return thought
