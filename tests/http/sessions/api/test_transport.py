"""The unified transport: headers, the error envelope (checked by the SDK's own schema), the
closed code set with status = HTTP status, and the request headers."""

from __future__ import annotations

import pytest

from troupe.actors.sessions import refusal_statuses
from troupe.http.sessions.api._transport import (
    ApiHeaderError,
    default_retry_actions,
    detail_reasons,
    domain_code_map,
    error_document,
    parse_headers,
    retry_actions,
    schema_hash_header_value,
    session_error_detail,
    unified_code_for,
    unified_codes,
    unified_detail,
    unified_headers,
)

pytest.importorskip("tansr_sdk")

from tansr_sdk.api import _schema_data  # noqa: E402
from tansr_sdk.api.operations import manifest  # noqa: E402
from tansr_sdk.api.schema import validate_wire  # noqa: E402

frozen = _schema_data.SCHEMAS["unified-v1"]["definitions"]


def test_the_code_set_and_retry_actions_are_the_sdks():
    assert set(unified_codes) == set(frozen["UnifiedCode"]["enum"])
    assert set(retry_actions) == set(frozen["RetryAction"]["enum"])
    assert detail_reasons == set(frozen["UnifiedErrorDetail"]["properties"]["reason"]["enum"])
    assert set(default_retry_actions.values()) <= set(retry_actions)


def test_unified_headers_carry_the_four_names_and_the_closure_only_when_given():
    headers = unified_headers()
    assert headers == {"tansr-contract": "unified-v1", "tansr-manifest-revision": "7", "tansr-domain": "session",
                       "tansr-schema-hash": schema_hash_header_value}
    assert schema_hash_header_value == "sha256:" + manifest()["schemaHash"]
    assert unified_headers("discovery", "a" * 64)["tansr-closure-id"] == "a" * 64
    with pytest.raises(AssertionError):
        unified_headers(closure_id="not-hex")


@pytest.mark.parametrize("code", sorted(unified_codes))
def test_every_code_with_every_allowed_status_is_a_valid_envelope(code):
    for status in unified_codes[code]:
        document = error_document(status, code, "m", detail=session_error_detail("x_code", status),
                                  request_id="key-1", trace_id="tr_1", retry_after_ms=1500)
        validate_wire("unified-v1", "UnifiedError", document)
        assert document["status"] == status and document["code"] == code
        assert set(document) == {"contract", "traceId", "requestId", "code", "status", "retryAction",
                                 "message", "retryAfterMs", "detail"}


def test_a_status_outside_the_codes_set_is_our_bug():
    with pytest.raises(AssertionError):
        error_document(404, "conflict", "m")


def test_envelope_bounds_and_fallbacks():
    document = error_document(400, "invalid_request", "x" * 2000, request_id="bad key", trace_id="bad trace!")
    assert len(document["message"]) == 1024 and document["requestId"] is None and document["traceId"] == "troupe"
    assert "detail" not in document and "retryAfterMs" not in document
    validate_wire("unified-v1", "UnifiedError", document)
    assert error_document(503, "capacity_exceeded", "")["retryAction"] == "same-request"
    assert error_document(503, "capacity_exceeded", "", retry_after_ms=0)["retryAfterMs"] == 1


@pytest.mark.parametrize("domain_code", sorted(refusal_statuses))
def test_every_session_family_code_maps_into_the_closed_set(domain_code):
    status = refusal_statuses[domain_code]
    code, http_status = unified_code_for(domain_code, status)
    assert http_status in unified_codes[code]
    document = error_document(http_status, code, domain_code, detail=session_error_detail(domain_code, status))
    validate_wire("unified-v1", "UnifiedError", document)
    assert document["detail"]["domainCode"] == domain_code and document["detail"]["domainStatus"] == status


def test_mapped_codes_are_known_and_unknown_codes_fall_back_by_status():
    assert set(domain_code_map.values()) <= set(unified_codes)
    assert unified_code_for("something_new", 409) == ("conflict", 409)
    assert unified_code_for("something_new", 418) == ("internal_error", 500)


def test_a_reason_outside_the_sdks_set_travels_as_domain_reason():
    assert unified_detail({"reason": "option_not_offered", "optionId": "x"}) == {
        "domainReason": "option_not_offered", "optionId": "x"}
    assert unified_detail({"reason": "closure_stale"})["domainReason"] == "closure_stale"
    assert unified_detail({"reason": "deadline_exceeded"}) == {"reason": "deadline_exceeded"}
    document = error_document(400, "invalid_request", "m", detail={"reason": "option_not_offered"})
    validate_wire("unified-v1", "UnifiedError", document)


def test_request_headers_are_read_and_checked():
    parsed = parse_headers({"tansr-session-family": "sdk1", "deadline": "2030-01-01T00:00:00.000Z",
                            "last-event-id": "12", "tansr-closure-id": "b" * 64, "idempotency-key": "k-1",
                            "tansr-event-envelope": "unified-v1"})
    assert (parsed.family, parsed.family_explicit, parsed.last_event_id) == ("sdk1", True, "12")
    assert parsed.deadline_ms == 1893456000000 and parsed.closure_id == "b" * 64
    assert (parsed.idempotency_key, parsed.event_envelope) == ("k-1", "unified-v1")
    assert parse_headers({}).family == "sdk1" and not parse_headers({}).family_explicit


@pytest.mark.parametrize("headers, header, reason", [
    ({"tansr-session-family": "sdk9"}, "tansr-session-family", None),
    ({"deadline": "tomorrow"}, "deadline", "deadline_invalid"),
    ({"tansr-closure-id": "B" * 64}, "tansr-closure-id", None),
    ({"tansr-closure-id": "b" * 63}, "tansr-closure-id", None),
    ({"idempotency-key": "k" * 129}, "idempotency-key", "idempotency_key_invalid"),
    ({"idempotency-key": "has space"}, "idempotency-key", "idempotency_key_invalid"),
    ({"tansr-event-envelope": "v2"}, "tansr-event-envelope", None),
])
def test_malformed_request_headers_are_400(headers, header, reason):
    with pytest.raises(ApiHeaderError) as caught:
        parse_headers(headers)
    assert (caught.value.status, caught.value.code, caught.value.header) == (400, "invalid_request", header)
    assert caught.value.reason == reason
    validate_wire("unified-v1", "UnifiedError", error_document(400, "invalid_request", "m",
                                                                detail=caught.value.detail()))


def test_idempotency_key_at_its_bound():
    assert parse_headers({"idempotency-key": "k" * 128}).idempotency_key == "k" * 128
