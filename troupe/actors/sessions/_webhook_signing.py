"""The turn-end webhook's configuration, payload and signatures (no I/O here).

Why a module of its own: what a receiver must verify is a wire contract, and keeping it in
pure functions means the bytes are the same whoever sends them (the delivery service, the
simulator's checker) and a test can pin them against a verifier written from the contract.

The contract (tansr /v2, "轮末出站 webhook"):
- the body is the minimal payload ``{sessionId, endUserId, turnId?, status, reason?, lastSeq,
  ts}``: never content, never credentials; ``ts`` is the issue time in epoch milliseconds;
- with a secret, ``x-tansr-signature: v2=<hex>, v1=<hex>`` (versions selectable, default
  both).  v2 is HMAC-SHA256 over the canonical string ``tansr-webhook-v2`` / method / URL
  path without the query / ``x-tansr-timestamp`` / ``x-tansr-nonce`` / hex SHA-256 of the body,
  joined by ``\\n``; v1 is HMAC-SHA256 over the raw body.  ``x-tansr-timestamp`` (epoch ms)
  and ``x-tansr-nonce`` (a random UUID per delivery) travel with it, and a retry resends the
  same timestamp, nonce and body, so a receiver can dedupe on them;
- opt-in Standard Webhooks headers (``webhook-id``, ``webhook-timestamp`` in seconds,
  ``webhook-signature: v1,<base64>`` over ``id.timestamp.body``); a ``whsec_`` secret is the
  base64 of the key, as that specification serialises it, any other secret is its UTF-8 bytes;
- no ``Authorization`` or cookie headers: authenticity is the signature's job.

The secret is wrapped in ``WebhookSecret`` so that it never shows up in a repr, a trace or an
error message; it is never stored (pending deliveries keep only the body, timestamp and
nonce, and headers are signed again at each attempt, which also lets a rotated secret apply
to deliveries still pending).

Configuration comes from the environment like ``tansr serve --v2``: ``TANSR_SERVE_NOTIFY_URL``
(absolute http(s) URL; anything else is ignored with a warning; no URL = no webhook) and
``TANSR_SERVE_NOTIFY_SECRET`` (only with a valid URL).  troupe adds two knobs:
``TANSR_SERVE_NOTIFY_SIGNATURE_VERSIONS`` (``v2,v1`` by default, or ``v2``, or ``v1``) and
``TANSR_SERVE_NOTIFY_STANDARD_WEBHOOKS=1``.  Loopback and private targets are allowed: the URL
is the operator's own configuration, unlike the URLs an agent's tools fetch.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

notify_url_variable = "TANSR_SERVE_NOTIFY_URL"
notify_secret_variable = "TANSR_SERVE_NOTIFY_SECRET"
notify_signature_versions_variable = "TANSR_SERVE_NOTIFY_SIGNATURE_VERSIONS"
notify_standard_webhooks_variable = "TANSR_SERVE_NOTIFY_STANDARD_WEBHOOKS"

signature_v2_prefix = "tansr-webhook-v2"
"""The protocol prefix, the first line of the v2 canonical string."""

signature_versions_all = ("v2", "v1")
signature_versions_default = ("v2", "v1")
"""Both, in this order (``v2=…, v1=…``), as @tansr/serve 0.8.0 signs by default."""

signature_header = "x-tansr-signature"
timestamp_header = "x-tansr-timestamp"
nonce_header = "x-tansr-nonce"
standard_id_header = "webhook-id"
standard_timestamp_header = "webhook-timestamp"
standard_signature_header = "webhook-signature"
standard_secret_prefix = "whsec_"

turn_end_statuses = ("completed", "aborted")
user_agent = "troupe-webhooks"

credential_header_names = frozenset({"authorization", "proxy-authorization", "cookie"})
"""Headers an outbound webhook request must never carry (the delivery strips them)."""

TurnEndStatus = Literal["completed", "aborted"]


class WebhookSecret:
    """The signing secret; its value never appears in ``repr``/``str`` (logs, traces)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        assert value, "an empty secret is no secret: use None"
        self._value = value

    def __repr__(self) -> str:
        return "WebhookSecret(<redacted>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WebhookSecret) and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        return hash(WebhookSecret)

    @property
    def hmac_key(self) -> bytes:
        """The key of the ``x-tansr-signature`` versions: the secret's UTF-8 bytes."""
        return self._value.encode("utf-8")

    @property
    def standard_webhooks_key(self) -> bytes:
        """The Standard Webhooks key: ``whsec_<base64>`` decoded, else the UTF-8 bytes."""
        if self._value.startswith(standard_secret_prefix):
            try:
                key = base64.b64decode(self._value[len(standard_secret_prefix):], validate=True)
            except (binascii.Error, ValueError):
                key = b""
            if key:
                return key
        return self.hmac_key


@dataclass(frozen=True)
class WebhookSettings:
    """Where turn-end webhooks go and how they are signed; ``url`` None = no webhook.

    ``warnings`` says what of the environment was ignored and why (never the secret's value,
    never the URL, which may hold a token in its query); the server prints them at start.
    """

    url: str | None = None
    secret: WebhookSecret | None = field(default=None, repr=False)
    signature_versions: tuple[str, ...] = signature_versions_default
    standard_webhooks: bool = False
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.signature_versions, "at least one signature version"
        assert all(version in signature_versions_all for version in self.signature_versions)
        assert len(set(self.signature_versions)) == len(self.signature_versions)
        assert self.url is None or url_problem(self.url) is None, "use from_environ / url_problem"

    @property
    def enabled(self) -> bool:
        return self.url is not None

    @property
    def path(self) -> str:
        """The URL path the v2 canonical string signs (without the query)."""
        assert self.url is not None
        return urlsplit(self.url).path or "/"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WebhookSettings:
        warnings: list[str] = []
        url = environ.get(notify_url_variable, "").strip()
        if not url:
            return cls()
        problem = url_problem(url)
        if problem is not None:
            warnings.append(f"{notify_url_variable} ignored ({problem}): the turn-end webhook is off")
            return cls(warnings=tuple(warnings))
        secret_value = environ.get(notify_secret_variable, "")
        versions = _parse_versions(environ.get(notify_signature_versions_variable, ""), warnings)
        standard = environ.get(notify_standard_webhooks_variable, "").strip().lower() in ("1", "true", "yes", "on")
        return cls(
            url=url,
            secret=WebhookSecret(secret_value) if secret_value else None,
            signature_versions=versions,
            standard_webhooks=standard,
            warnings=tuple(warnings),
        )


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook target, or None.  User info is refused because it
    would put credentials into the outbound request."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https"):
        return "not an absolute http(s) URL"
    if not parts.hostname:
        return "no host"
    if parts.username is not None or parts.password is not None:
        return "credentials in the URL"
    if parts.fragment:
        return "a fragment in the URL"
    assert port is None or 0 <= port <= 65535
    return None


def _parse_versions(text: str, warnings: list[str]) -> tuple[str, ...]:
    if not text.strip():
        return signature_versions_default
    versions = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    if not versions or any(version not in signature_versions_all for version in versions):
        warnings.append(f"{notify_signature_versions_variable} must list v2 and/or v1; signing with both")
        return signature_versions_default
    return versions


# ---------------------------------------------------------------------------------------------
# Payload
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnEndNotice:
    """What the session actor knows at a turn's end; ``reason`` is the terminal reason as the
    kernel's terminal event carries it (``client_gone``, ``max_turns``, ``aborted_*``...)."""

    session_id: str
    end_user_id: str
    turn_id: str
    status: TurnEndStatus
    last_seq: int
    reason: str | None = None

    def __post_init__(self) -> None:
        assert self.session_id and self.end_user_id and self.turn_id
        assert self.status in turn_end_statuses, self.status
        assert self.last_seq >= 0


def turn_end_body(notice: TurnEndNotice, timestamp_ms: int) -> bytes:
    """The POST body: compact JSON in the contract's key order; nothing else is ever added."""
    payload: dict[str, Any] = {
        "sessionId": notice.session_id,
        "endUserId": notice.end_user_id,
        "turnId": notice.turn_id,
        "status": notice.status,
    }
    if notice.reason is not None:
        payload["reason"] = notice.reason
    payload["lastSeq"] = notice.last_seq
    payload["ts"] = timestamp_ms
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def nonce_from_bytes(raw: bytes) -> str:
    """A version-4 UUID string made of 16 random bytes from the Env (never ``uuid4()``)."""
    assert len(raw) == 16
    return str(uuid.UUID(bytes=raw, version=4))


# ---------------------------------------------------------------------------------------------
# Signatures
# ---------------------------------------------------------------------------------------------


def canonical_v2(method: str, path: str, timestamp_ms: int, nonce: str, body: bytes) -> bytes:
    """The v2 signed string: prefix, method, path, timestamp, nonce, body SHA-256 hex."""
    lines = (signature_v2_prefix, method.upper(), path, str(timestamp_ms), nonce, hashlib.sha256(body).hexdigest())
    return "\n".join(lines).encode("utf-8")


def signature_v2(secret: WebhookSecret, method: str, path: str, timestamp_ms: int, nonce: str, body: bytes) -> str:
    message = canonical_v2(method, path, timestamp_ms, nonce, body)
    return hmac.new(secret.hmac_key, message, hashlib.sha256).hexdigest()


def signature_v1(secret: WebhookSecret, body: bytes) -> str:
    return hmac.new(secret.hmac_key, body, hashlib.sha256).hexdigest()


def standard_webhooks_signature(secret: WebhookSecret, message_id: str, timestamp_seconds: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 over "id.timestamp.body">`` (Standard Webhooks)."""
    signed = f"{message_id}.{timestamp_seconds}.".encode() + body
    digest = hmac.new(secret.standard_webhooks_key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def webhook_headers(
    settings: WebhookSettings, *, delivery_id: str, timestamp_ms: int, nonce: str, body: bytes
) -> dict[str, str]:
    """Every header of one POST; the same inputs give the same headers at every attempt."""
    headers = {
        "content-type": "application/json",
        "user-agent": user_agent,
        timestamp_header: str(timestamp_ms),
        nonce_header: nonce,
    }
    secret = settings.secret
    if secret is not None:
        parts = []
        for version in settings.signature_versions:
            if version == "v2":
                parts.append("v2=" + signature_v2(secret, "POST", settings.path, timestamp_ms, nonce, body))
            else:
                parts.append("v1=" + signature_v1(secret, body))
        headers[signature_header] = ", ".join(parts)
    if settings.standard_webhooks:
        timestamp_seconds = timestamp_ms // 1000
        headers[standard_id_header] = delivery_id
        headers[standard_timestamp_header] = str(timestamp_seconds)
        if secret is not None:
            headers[standard_signature_header] = standard_webhooks_signature(secret, delivery_id, timestamp_seconds, body)
    assert not credential_header_names & headers.keys()
    return headers


__all__ = [
    "TurnEndNotice",
    "WebhookSecret",
    "WebhookSettings",
    "canonical_v2",
    "nonce_from_bytes",
    "notify_secret_variable",
    "notify_signature_versions_variable",
    "notify_standard_webhooks_variable",
    "notify_url_variable",
    "signature_v1",
    "signature_v2",
    "signature_v2_prefix",
    "signature_versions_default",
    "standard_webhooks_signature",
    "turn_end_body",
    "url_problem",
    "webhook_headers",
]
