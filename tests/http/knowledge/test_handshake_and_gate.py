"""The handshake (``/version``, ``/health``, ``/capabilities``, ``/openapi.json``) and the gate
over real HTTP: request ids on every response, the error envelope on every error the gate
makes (Host, 404, 405, 413 at and just over each route's limit, a chunked body), 503
``SCHEMA_NOT_READY`` while the database lags, and 500/503 from crashed or overloaded actors."""

from __future__ import annotations

import pytest

from tests.http._harness import chunked_upload
from troupe.actors.knowledge import WriteMemory, api_version, knowledge_schema_version
from troupe.http.knowledge import (
    HandshakeSettings,
    KnowledgeBackendUnavailable,
    new_knowledge_surface,
    platform_facts,
    product_version,
    small_body_bytes_max,
    write_body_bytes_max,
)
from troupe.retrieval import retrieval_migrations

from ._knowledge_harness import assert_error, bill, start_knowledge_server


async def test_version_health_and_capabilities_answer_the_contract_shapes(client):
    version = await client.get("/version")
    assert version.status_code == 200
    assert version.json() == {"product_version": "development", "component": "pixiu-memory-backend",
                              "api_version": api_version, "agent_memory_api": 1,
                              "schema_version": knowledge_schema_version}
    health = await client.get("/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ready", "product_version": "development",
                             "component": "pixiu-memory-backend", "database": "ok",
                             "schema_version": knowledge_schema_version}
    capabilities = await client.get("/capabilities")
    assert capabilities.json() == {
        "platform": {"family": "debian", "version_major": "12", "v11": False},
        "embedding": {"configured": "auto", "runtime": "hashed", "compliant": False},
        "vector_store": {"configured": "auto", "runtime": "usearch", "compliant": False},
        "contest_ready": False,
    }
    text = capabilities.text
    assert "127.0.0.1" not in text and "/" not in text.replace("\\/", "")


def test_product_version_is_injected_or_development_and_platform_facts_are_sanitised():
    assert product_version({}) == "development"
    assert product_version({"TROUPE_PRODUCT_VERSION": "0.1.7"}) == "0.1.7"
    assert product_version({"TROUPE_PRODUCT_VERSION": "0.1.7; rm -rf /"}) == "development"
    assert platform_facts('ID=kylin\nVERSION_ID="V11"\n') == ("kylin", "11")
    assert platform_facts(None) == ("unknown", "unknown")
    settings = HandshakeSettings.from_environment({"TROUPE_KNOWLEDGE_EMBEDDING": "local"}, "ID=kylin\nVERSION_ID=11\n")
    assert (settings.platform_family, settings.platform_version_major, settings.embedding_configured) == (
        "kylin", "11", "local")
    with pytest.raises(KnowledgeBackendUnavailable):
        new_knowledge_surface({"TROUPE_KNOWLEDGE_VECTOR_STORE": "kylin"}, os_release_text="")
    with pytest.raises(KnowledgeBackendUnavailable):
        new_knowledge_surface({"TROUPE_KNOWLEDGE_EMBEDDING": "nonsense"}, os_release_text="")


async def test_openapi_lists_every_route_with_its_request_model(client):
    document = (await client.get("/openapi.json")).json()
    assert document["openapi"] == "3.1.0"
    assert "/memory/write" in document["paths"] and "/preference/{id}/history" in document["paths"]
    assert "MemoryWriteIn" in document["components"]["schemas"]
    from troupe.http.knowledge._routes import operations

    # Every served route is documented (device sync, monitoring and OCR joined the table later).
    assert {operation.path for operation in operations if operation.name != "events"} <= set(document["paths"])


async def test_every_response_carries_a_request_id_echoed_when_valid(client):
    made = await client.get("/version")
    assert made.headers["x-request-id"].startswith("req_")
    echoed = await client.get("/version", headers={"X-Request-Id": "agent-42:turn.7"})
    assert echoed.headers["x-request-id"] == "agent-42:turn.7"
    refused = await client.get("/version", headers={"X-Request-Id": "bad id with spaces"})
    assert refused.headers["x-request-id"].startswith("req_")
    error = await client.get("/nowhere", headers={"X-Request-Id": "mine-1"})
    assert assert_error(error, 404, "NOT_FOUND")["request_id"] == "mine-1"


async def test_the_gate_refuses_bad_hosts_unknown_routes_and_wrong_methods(client):
    assert_error(await client.get("/version", headers={"Host": "attacker.example"}), 400, "INVALID_REQUEST")
    assert_error(await client.get("/memory/nowhere"), 404, "NOT_FOUND")
    assert_error(await client.get("/no/such/route"), 404, "NOT_FOUND")
    wrong = await client.get("/memory/write")
    assert_error(wrong, 405, "METHOD_NOT_ALLOWED")
    assert wrong.headers["allow"] == "POST"
    assert_error(await client.post("/evidence/evd_1"), 405, "METHOD_NOT_ALLOWED")
    assert_error(await client.get("/events"), 400, "INVALID_REQUEST")  # no upgrade


async def test_bodies_are_refused_just_over_each_route_limit(client, knowledge_server):
    padding = " " * (small_body_bytes_max - len(b'{"text":"x"}'))
    at_limit = ('{"text":"x"}' + padding).encode()
    assert len(at_limit) == small_body_bytes_max
    accepted = await client.post("/memory/query", content=at_limit, headers={"content-type": "application/json"})
    assert accepted.status_code == 200
    assert_error(await client.post("/memory/query", content=at_limit + b" "), 413, "PAYLOAD_TOO_LARGE")
    assert_error(await client.request("GET", "/version", content=b"x"), 413, "PAYLOAD_TOO_LARGE")
    huge = b'{"source_type":"OCR","raw":{"t":"' + b"a" * write_body_bytes_max + b'"},"scope":"user:a"}'
    assert_error(await client.post("/memory/write", content=huge), 413, "PAYLOAD_TOO_LARGE")
    outcome = await chunked_upload(knowledge_server.port, "/memory/query")
    assert outcome.closed_by_server and outcome.status == 413
    assert b'"error":"PAYLOAD_TOO_LARGE"' in outcome.response


async def test_schema_failures_are_400_invalid_request_with_the_field_named(client):
    error = assert_error(await client.post("/memory/write", json={**bill(), "source_type": "EMAIL"}),
                         400, "INVALID_REQUEST")
    assert error["message"].startswith("field 'source_type' must be one of: OCR")
    assert_error(await client.post("/memory/write", content=b"{not json"), 400, "INVALID_REQUEST")
    assert_error(await client.post("/memory/write", content=b'{"raw": NaN}'), 400, "INVALID_REQUEST")
    assert_error(await client.post("/memory/write", content=b""), 400, "INVALID_REQUEST")
    assert_error(await client.post("/memory/write", json=[1, 2]), 400, "INVALID_REQUEST")


async def test_crashed_and_overloaded_actors_answer_500_and_503_without_details(client, knowledge_server):
    knowledge_server.faults[WriteMemory] = "crash"
    crashed = assert_error(await client.post("/memory/write", json=bill()), 500, "INTERNAL_ERROR")
    assert crashed["message"] == "internal error"
    knowledge_server.faults[WriteMemory] = "overloaded"
    busy = await client.post("/memory/write", json=bill())
    assert_error(busy, 503, "OVERLOADED")
    assert busy.headers["retry-after"] == "2"


async def test_a_database_behind_the_code_is_schema_not_ready(nursery, tmp_path):
    server = await start_knowledge_server(nursery, str(tmp_path / "data"), migrations=retrieval_migrations())
    async with server.client() as client:
        version = await client.get("/version")
        assert version.status_code == 200 and version.json()["schema_version"] == 0
        assert_error(await client.get("/health"), 503, "SCHEMA_NOT_READY")
        assert_error(await client.post("/memory/write", json=bill()), 503, "SCHEMA_NOT_READY")
        assert (await client.get("/capabilities")).status_code == 200
