"""The turn-end webhook's wire contract: payload bytes, signatures checked by a verifier
written here from the contract's text (not from the code under test), configuration from the
environment, and the secret kept out of every repr and warning."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re

import pytest

from troupe.actors.sessions import (
    TurnEndNotice,
    WebhookSecret,
    WebhookSettings,
    nonce_from_bytes,
    turn_end_body,
    webhook_headers,
)

SECRET = "s3cret-value-never-logged"


# -- an independent verifier (receiver side), written from the contract ------------------------


def parse_signature_header(value: str) -> dict[str, str]:
    parts = [part.strip() for part in value.split(",")]
    return dict(part.split("=", 1) for part in parts)


def verify_tansr(secret: str, method: str, path: str, headers: dict[str, str], body: bytes) -> str:
    """Receiver logic: v2 when present (never downgrade), else v1.  Returns the version checked."""
    signatures = parse_signature_header(headers["x-tansr-signature"])
    key = secret.encode()
    if "v2" in signatures:
        canonical = "\n".join([
            "tansr-webhook-v2", method, path, headers["x-tansr-timestamp"], headers["x-tansr-nonce"],
            hashlib.sha256(body).hexdigest(),
        ])
        expected = hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()
        assert hmac.compare_digest(expected, signatures["v2"]), "v2 signature"
        return "v2"
    expected = hmac.new(key, body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, signatures["v1"]), "v1 signature"
    return "v1"


def verify_standard(secret: str, headers: dict[str, str], body: bytes) -> None:
    if secret.startswith("whsec_"):
        key = base64.b64decode(secret[len("whsec_"):])
    else:
        key = secret.encode()
    signed = headers["webhook-id"].encode() + b"." + headers["webhook-timestamp"].encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    candidates = [entry.split(",", 1)[1] for entry in headers["webhook-signature"].split(" ")]
    assert any(hmac.compare_digest(expected, candidate) for candidate in candidates)


# -- fixtures -----------------------------------------------------------------------------------

notice = TurnEndNotice(session_id="s_1", end_user_id="u_123", turn_id="t_9", status="completed",
                       last_seq=1234, reason="client_gone")


def settings(**environ: str) -> WebhookSettings:
    base = {"TANSR_SERVE_NOTIFY_URL": "http://127.0.0.1:9000/tansr/turn-end?tenant=a",
            "TANSR_SERVE_NOTIFY_SECRET": SECRET}
    base.update(environ)
    return WebhookSettings.from_environ({key: value for key, value in base.items() if value is not None})


def headers_for(config: WebhookSettings, body: bytes) -> dict[str, str]:
    return webhook_headers(config, delivery_id="msg_1", timestamp_ms=1712345678901,
                           nonce="0b7a6f4e-5a2c-4e1f-9d3b-2c1e0f9a8b7c", body=body)


# -- payload ------------------------------------------------------------------------------------


def test_payload_is_the_minimal_compact_json_in_contract_order():
    body = turn_end_body(notice, 1712345678901)
    assert body == (b'{"sessionId":"s_1","endUserId":"u_123","turnId":"t_9","status":"completed",'
                    b'"reason":"client_gone","lastSeq":1234,"ts":1712345678901}')
    bare = turn_end_body(TurnEndNotice("s_2", "用户", "t", "aborted", 0), 5)
    assert json.loads(bare) == {"sessionId": "s_2", "endUserId": "用户", "turnId": "t", "status": "aborted",
                                "lastSeq": 0, "ts": 5}
    assert "用户".encode() in bare  # not \\u-escaped


def test_notice_refuses_other_statuses():
    with pytest.raises(AssertionError):
        TurnEndNotice("s", "u", "t", "failed", 1)  # type: ignore[arg-type]


# -- signatures ---------------------------------------------------------------------------------


def test_default_signs_v2_then_v1_and_both_verify_independently():
    config = settings()
    body = turn_end_body(notice, 1712345678901)
    headers = headers_for(config, body)
    assert re.fullmatch(r"v2=[0-9a-f]{64}, v1=[0-9a-f]{64}", headers["x-tansr-signature"])
    # The path signed is the URL's path without its query.
    assert verify_tansr(SECRET, "POST", "/tansr/turn-end", headers, body) == "v2"
    v1_only = {**headers, "x-tansr-signature": "v1=" + parse_signature_header(headers["x-tansr-signature"])["v1"]}
    assert verify_tansr(SECRET, "POST", "/tansr/turn-end", v1_only, body) == "v1"
    assert headers["x-tansr-timestamp"] == "1712345678901"
    assert headers["content-type"] == "application/json"


def test_tampering_breaks_the_v2_signature():
    config = settings()
    body = turn_end_body(notice, 1712345678901)
    headers = headers_for(config, body)
    for changed_headers, changed_body, path in (
        ({**headers, "x-tansr-nonce": "other"}, body, "/tansr/turn-end"),
        ({**headers, "x-tansr-timestamp": "1712345678902"}, body, "/tansr/turn-end"),
        (headers, body.replace(b"1234", b"1235"), "/tansr/turn-end"),
        (headers, body, "/tansr/other"),
    ):
        with pytest.raises(AssertionError, match="v2 signature"):
            verify_tansr(SECRET, "POST", path, changed_headers, changed_body)
    with pytest.raises(AssertionError):
        verify_tansr("wrong-secret", "POST", "/tansr/turn-end", headers, body)


def test_signature_versions_are_selectable():
    body = b"{}"
    only_v2 = headers_for(settings(TANSR_SERVE_NOTIFY_SIGNATURE_VERSIONS="v2"), body)
    assert re.fullmatch(r"v2=[0-9a-f]{64}", only_v2["x-tansr-signature"])
    only_v1 = headers_for(settings(TANSR_SERVE_NOTIFY_SIGNATURE_VERSIONS=" V1 "), body)
    assert re.fullmatch(r"v1=[0-9a-f]{64}", only_v1["x-tansr-signature"])
    assert verify_tansr(SECRET, "POST", "/tansr/turn-end", only_v1, body) == "v1"
    reversed_order = headers_for(settings(TANSR_SERVE_NOTIFY_SIGNATURE_VERSIONS="v1,v2"), body)
    assert reversed_order["x-tansr-signature"].startswith("v1=")
    bad = settings(TANSR_SERVE_NOTIFY_SIGNATURE_VERSIONS="v3")
    assert bad.signature_versions == ("v2", "v1") and len(bad.warnings) == 1


def test_no_secret_no_signature_and_never_credentials():
    config = settings(TANSR_SERVE_NOTIFY_SECRET="")
    assert config.secret is None
    headers = headers_for(config, b"{}")
    assert "x-tansr-signature" not in headers and "webhook-signature" not in headers
    for signed in (headers, headers_for(settings(TANSR_SERVE_NOTIFY_STANDARD_WEBHOOKS="1"), b"{}")):
        lowered = {name.lower() for name in signed}
        assert not lowered & {"authorization", "proxy-authorization", "cookie"}


@pytest.mark.parametrize("secret", ["whsec_" + base64.b64encode(b"raw key bytes \x00\xff").decode(), "plain-secret"])
def test_standard_webhooks_headers_are_opt_in_and_verify(secret):
    body = turn_end_body(notice, 1712345678901)
    assert "webhook-id" not in headers_for(settings(TANSR_SERVE_NOTIFY_SECRET=secret), body)
    config = settings(TANSR_SERVE_NOTIFY_SECRET=secret, TANSR_SERVE_NOTIFY_STANDARD_WEBHOOKS="true")
    headers = headers_for(config, body)
    assert headers["webhook-id"] == "msg_1"
    assert headers["webhook-timestamp"] == "1712345678"  # seconds
    assert re.fullmatch(r"v1,[A-Za-z0-9+/]+=*", headers["webhook-signature"])
    verify_standard(secret, headers, body)
    assert verify_tansr(secret, "POST", "/tansr/turn-end", headers, body) == "v2"


def test_nonce_is_a_version_4_uuid_from_the_given_bytes():
    nonce = nonce_from_bytes(bytes(range(16)))
    assert nonce == nonce_from_bytes(bytes(range(16)))
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", nonce)


# -- configuration ------------------------------------------------------------------------------


def test_no_url_means_no_webhook():
    assert not WebhookSettings.from_environ({}).enabled
    assert not WebhookSettings.from_environ({"TANSR_SERVE_NOTIFY_SECRET": SECRET}).enabled
    assert WebhookSettings.from_environ({"TANSR_SERVE_NOTIFY_URL": "  "}).warnings == ()


@pytest.mark.parametrize("url", [
    "ftp://example.com/hook", "/relative/path", "example.com/hook", "http://", "http://user:pw@example.com/",
    "https://example.com:99999/", "http://example.com/#fragment",
])
def test_invalid_urls_are_ignored_with_a_warning(url):
    config = settings(TANSR_SERVE_NOTIFY_URL=url)
    assert not config.enabled and config.secret is None
    assert len(config.warnings) == 1 and "TANSR_SERVE_NOTIFY_URL" in config.warnings[0]
    assert SECRET not in config.warnings[0] and "pw" not in config.warnings[0]


def test_loopback_and_private_targets_are_allowed():
    for url in ("http://127.0.0.1:1/x", "http://10.0.0.5/x", "https://[::1]:8443/hook", "http://localhost/"):
        assert settings(TANSR_SERVE_NOTIFY_URL=url).enabled
    assert settings(TANSR_SERVE_NOTIFY_URL="http://localhost").path == "/"


def test_the_secret_never_shows():
    config = settings(TANSR_SERVE_NOTIFY_STANDARD_WEBHOOKS="1")
    assert config.secret == WebhookSecret(SECRET)
    for text in (repr(config), str(config), repr(config.secret), str(config.secret), f"{config.secret}"):
        assert SECRET not in text
    assert "redacted" in repr(config.secret)
