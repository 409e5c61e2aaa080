"""The knowledge store on a real engine: evidence as written (with provenance), the durable
structuring outbox, knowledge creation once per evidence, updates (receipt first, 404 without
an existence leak, KNOWLEDGE_NOT_ACTIVE, VERSION_CONFLICT, a new evidence row per update),
lifecycle contexts, preferences with every version, conflicts with derived severity, forget
cascades and their tombstones, and every bound at and just over its limit."""

from __future__ import annotations

import pytest

import troupe.actors.knowledge as knowledge
from troupe.actors.knowledge import (
    ContextDraft,
    EvidenceDraft,
    KnowledgeUpdateDraft,
    Relation,
    _receipts,
    _schema,
    _scopes,
    _sensitivity,
    _store,
    conflict_status_for_knowledge,
    conflicts_list_max,
    create_knowledge,
    entities_per_knowledge_max,
    evidence_ids_for_knowledge,
    evidence_ids_for_knowledge_many,
    evidence_quality_score,
    evidence_raw_bytes_max,
    expire_contexts,
    forget_apply,
    forget_items_per_call_max,
    forget_plan,
    forget_request_confirm,
    forget_request_put,
    forgotten_among,
    get_context,
    get_evidence,
    get_evidence_many,
    get_knowledge,
    ids_per_lookup_max,
    insert_conflict,
    insert_evidence,
    knowledge_entities,
    knowledge_in_scope,
    knowledge_relations,
    knowledge_sensitivity,
    knowledge_sharing_entities,
    knowledge_title_characters_max,
    list_conflicts,
    list_preferences,
    manual_conflicts_pending,
    mark_context_promoted,
    operation_memory_update,
    preference_history,
    preference_versions_max,
    receipt_get,
    receipt_namespace_update,
    record_lifecycle,
    relations_per_knowledge_max,
    request_hash,
    resolve_conflict,
    set_knowledge_status,
    stored_preference_key_characters_max,
    structuring_attempts_max,
    structuring_due,
    structuring_failed,
    structuring_next_at,
    update_knowledge,
    upsert_preference,
    write_evidence,
)
from troupe.storage import StorageError

from .store_helpers import base_time, open_knowledge_engine

refused = (ValueError, StorageError)
home = "shared:home"
alice = "user:alice"
bill = {"title": "2026年4月家庭支出清单",
        "body": {"items": [{"category": "水电燃气", "vendor": "国家电网", "amount": 210.0}]},
        "entities": ["国家电网", "市自来水公司"],
        "relations": [{"from": "国家电网", "to": "水电燃气", "type": "BELONG_TO"}]}


@pytest.fixture
async def engine(nursery, tmp_path):
    return await open_knowledge_engine(nursery, tmp_path)


def ocr(scope: str = home, raw: dict | None = None, **options) -> EvidenceDraft:
    raw = bill if raw is None else raw
    return EvidenceDraft(scope=scope, source_type="OCR", raw=raw,
                         context={"source_device": "书房工作站", "trigger_event": "OCR_RESULT"},
                         quality_score=evidence_quality_score("OCR", raw), **options)


async def add_item(engine, evidence_id: str = "evd_1", knowledge_id: str = "knw_1",
                   scope: str = home, **options):
    await engine.write(lambda c: insert_evidence(c, ocr(scope, **options),
                                                 evidence_id=evidence_id, now=base_time,
                                                 structure=True))
    item, created = await engine.write(lambda c: create_knowledge(
        c, knowledge_id=knowledge_id, evidence_id=evidence_id, title=bill["title"],
        body=bill["body"], entities=bill["entities"],
        relations=[Relation.decode(value) for value in bill["relations"]], now=base_time))
    assert created
    return item


def test_the_package_exports_the_store_slice_sorted():
    for module in (_receipts, _schema, _scopes, _sensitivity, _store):
        assert module.__all__ == sorted(module.__all__)
        for name in module.__all__:
            assert name in knowledge.__all__, name
            assert getattr(knowledge, name) is getattr(module, name), name


# -- evidence ------------------------------------------------------------------------------


async def test_evidence_is_kept_as_written_and_detailed_as_the_contract_says(engine):
    provenance = {"session_id": "s", "run_id": "r", "turn_id": "t", "occurred_at": 1788393600}
    draft = EvidenceDraft(scope=alice, source_type="CONVERSATION",
                          raw={"user": "请保持回答简洁", "assistant": "好的"},
                          provenance=provenance, sensitivity=1,
                          sensitivity_categories=("phone_number",), quality_score=0.77)
    outcome = await engine.write(lambda c: write_evidence(
        c, draft, evidence_id="evd_1", now=base_time + 0.5, latency_ms=12))
    assert outcome.response() == {"evidence_id": "evd_1", "status": "accepted",
                                  "quality_score": 0.77, "sensitivity": 1, "latency_ms": 12}
    evidence = await engine.read(lambda c: get_evidence(c, "evd_1"))
    assert evidence.detail() == {
        "id": "evd_1", "source_type": "CONVERSATION",
        "raw": {"user": "请保持回答简洁", "assistant": "好的"}, "quality_score": 0.77,
        "sensitivity": 1, "scope": alice, "created_at": int(base_time), "provenance": provenance}
    assert evidence.sensitivity_categories == ("phone_number",)
    assert await engine.read(lambda c: get_evidence(c, "evd_nope")) is None
    # The write queued its structuring in the same transaction: durable work.
    tasks = await engine.read(lambda c: structuring_due(c, base_time + 1))
    assert [(task.evidence_id, task.scope, task.knowledge_id) for task in tasks] == [
        ("evd_1", alice, None)]


async def test_the_store_refuses_what_the_layers_above_must_have_refused(engine):
    with pytest.raises(refused):  # sensitive content never reaches a shared scope
        await engine.write(lambda c: insert_evidence(
            c, ocr(home, sensitivity=2), evidence_id="evd_1", now=base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: insert_evidence(
            c, EvidenceDraft(scope=home, source_type="EMAIL", raw={}), evidence_id="e",
            now=base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: insert_evidence(
            c, ocr("team:home"), evidence_id="e", now=base_time))
    assert await engine.read(lambda c: get_evidence(c, "evd_1")) is None


async def test_raw_evidence_at_and_over_its_size_limit(engine):
    overhead = len('{"text":""}')
    at_limit = {"text": "a" * (evidence_raw_bytes_max - overhead)}
    await engine.write(lambda c: insert_evidence(c, ocr(raw=at_limit), evidence_id="evd_1",
                                                 now=base_time))
    over = {"text": "a" * (evidence_raw_bytes_max - overhead + 1)}
    with pytest.raises(refused):
        await engine.write(lambda c: insert_evidence(c, ocr(raw=over), evidence_id="evd_2",
                                                     now=base_time))


def test_quality_scores_are_deterministic_and_bounded():
    assert evidence_quality_score("OCR", bill) == evidence_quality_score("OCR", dict(bill))
    assert 0 < evidence_quality_score("USER_BEHAVIOR", {}) < evidence_quality_score(
        "MANUAL_CONFIG", {"title": "t", "body": "x" * 10_000}) <= 1.0


async def test_lookups_at_and_over_their_id_limit(engine):
    ids = [f"evd_{index}" for index in range(ids_per_lookup_max)]
    assert await engine.read(lambda c: get_evidence_many(c, ids)) == {}
    with pytest.raises(refused):
        await engine.read(lambda c: get_evidence_many(c, [*ids, "evd_more"]))


# -- knowledge and structuring -------------------------------------------------------------


async def test_structuring_creates_one_item_per_evidence_and_finishes_its_task(engine):
    item = await add_item(engine)
    assert (item.id, item.scope, item.status, item.version, item.title) == (
        "knw_1", home, "ACTIVE", 1, bill["title"])
    again, created = await engine.write(lambda c: create_knowledge(
        c, knowledge_id="knw_2", evidence_id="evd_1", title="x", body={}, now=base_time))
    assert (again.id, created) == ("knw_1", False)
    assert await engine.read(lambda c: structuring_due(c, base_time + 10)) == []
    assert await engine.read(lambda c: evidence_ids_for_knowledge(c, "knw_1")) == ["evd_1"]
    assert await engine.read(lambda c: knowledge_entities(c, "knw_1")) == sorted(
        bill["entities"])
    relations = await engine.read(lambda c: knowledge_relations(c, "knw_1"))
    assert [relation.encode() for relation in relations] == bill["relations"]
    # Forgotten before structuring ran: nothing is created.
    gone = await engine.write(lambda c: create_knowledge(
        c, knowledge_id="knw_3", evidence_id="evd_missing", title="x", body={}, now=base_time))
    assert gone == (None, False)


async def test_the_relation_graph_stays_inside_its_scope(engine):
    await add_item(engine)
    await add_item(engine, "evd_2", "knw_2", scope=alice)
    assert await engine.read(lambda c: knowledge_sharing_entities(c, home, ["国家电网"])) == [
        ("knw_1", 1)]
    assert await engine.read(lambda c: knowledge_sharing_entities(
        c, alice, ["水电燃气", "国家电网"])) == [("knw_2", 2)]
    assert await engine.read(lambda c: knowledge_sharing_entities(c, "user:bob", ["国家电网"])) == []


async def test_structure_limits_at_and_over_their_boundary(engine):
    await add_item(engine)
    names = [f"e{index}" for index in range(entities_per_knowledge_max)]
    edges = [Relation("a", "b", "T")] * relations_per_knowledge_max
    await engine.write(lambda c: _store.replace_structure(c, "knw_1", names, edges))
    assert len(await engine.read(lambda c: knowledge_entities(c, "knw_1"))) == len(names)
    with pytest.raises(refused):
        await engine.write(lambda c: _store.replace_structure(c, "knw_1", [*names, "more"], []))
    with pytest.raises(refused):
        await engine.write(lambda c: _store.replace_structure(
            c, "knw_1", [], [*edges, Relation("a", "b", "T")]))


async def test_structuring_tasks_retry_and_are_dropped_after_the_last_attempt(engine):
    await engine.write(lambda c: insert_evidence(c, ocr(), evidence_id="evd_1", now=base_time,
                                                 structure=True))
    for attempt in range(1, structuring_attempts_max):
        retry_at = base_time + attempt
        assert await engine.write(lambda c, retry_at=retry_at: structuring_failed(
            c, "evd_1", error="model down", retry_at=retry_at))
        assert await engine.read(lambda c, at=retry_at - 0.5: structuring_due(c, at)) == []
        assert await engine.read(structuring_next_at) == base_time + attempt
    assert not await engine.write(lambda c: structuring_failed(
        c, "evd_1", error="model down", retry_at=base_time + 99))
    assert await engine.read(structuring_next_at) is None
    assert await engine.read(lambda c: get_evidence(c, "evd_1")) is not None


async def test_sensitivity_of_an_item_is_its_most_sensitive_evidence(engine):
    await add_item(engine, scope=alice)
    await add_item(engine, "evd_2", "knw_2", scope=alice, sensitivity=3)
    await engine.write(lambda c: _store.link_evidence(c, "knw_1", "evd_2", base_time))
    assert await engine.read(lambda c: knowledge_sensitivity(c, ["knw_1", "knw_x"])) == {
        "knw_1": 3, "knw_x": 0}


# -- updates -------------------------------------------------------------------------------


def update_draft(**changes) -> KnowledgeUpdateDraft:
    values = dict(knowledge_id="knw_1", expected_version=1, scope=home,
                  body={"vendor": "国家电网", "amount": 230},
                  idempotency_key="update-session-01-turn-04")
    values.update(changes)
    return KnowledgeUpdateDraft(**values)


def update_hash(draft: KnowledgeUpdateDraft) -> str:
    return request_hash(operation_memory_update, {
        "knowledge_id": draft.knowledge_id, "expected_version": draft.expected_version,
        "scope": draft.scope, "title": draft.title, "body": draft.body,
        "idempotency_key": draft.idempotency_key})


async def update(engine, draft: KnowledgeUpdateDraft, evidence_id: str, now: float = base_time):
    return await engine.write(lambda c: update_knowledge(
        c, draft, evidence_id=evidence_id, now=now, latency_ms=31,
        request_hash=update_hash(draft)))


async def test_an_update_bumps_the_version_with_a_new_evidence_and_replays(nursery, tmp_path):
    engine = await open_knowledge_engine(nursery, tmp_path)
    await add_item(engine)
    first = await update(engine, update_draft(), "evd_u1", base_time + 10)
    assert first.response() == {"knowledge_id": "knw_1", "evidence_id": "evd_u1",
                                "version": 2, "status": "updated", "latency_ms": 31}
    assert first.previous.version == 1 and first.previous.body == bill["body"]
    item = await engine.read(lambda c: get_knowledge(c, "knw_1"))
    assert (item.version, item.title, item.body) == (2, bill["title"],
                                                     {"vendor": "国家电网", "amount": 230})
    evidence = await engine.read(lambda c: get_evidence(c, "evd_u1"))
    assert (evidence.origin, evidence.knowledge_id, evidence.raw) == (
        "update", "knw_1", {"body": {"vendor": "国家电网", "amount": 230}})
    assert await engine.read(lambda c: evidence_ids_for_knowledge(c, "knw_1")) == [
        "evd_1", "evd_u1"]
    tasks = await engine.read(lambda c: structuring_due(c, base_time + 10))
    assert [(task.evidence_id, task.knowledge_id) for task in tasks] == [("evd_u1", "knw_1")]
    await engine.aclose()

    # After a restart the same update replays its first response, though version 1 is stale.
    engine = await open_knowledge_engine(nursery, tmp_path)
    again = await update(engine, update_draft(), "evd_u2", base_time + 20)
    assert again.replayed and again.response_json == first.response_json
    assert (await engine.read(lambda c: get_knowledge(c, "knw_1"))).version == 2
    assert await engine.read(lambda c: get_evidence(c, "evd_u2")) is None
    receipt = await engine.read(lambda c: receipt_get(
        c, receipt_namespace_update, "update-session-01-turn-04", scope=home))
    assert receipt.state == "COMPLETED"
    await engine.aclose()


async def test_update_refusals_write_nothing_not_even_the_receipt(engine):
    await add_item(engine)
    await add_item(engine, "evd_2", "knw_2", scope=alice)
    cases = [
        (update_draft(knowledge_id="knw_missing"), "NOT_FOUND", 404),
        (update_draft(knowledge_id="knw_2"), "NOT_FOUND", 404),  # another scope's item
        (update_draft(expected_version=7), "VERSION_CONFLICT", 409),
    ]
    for draft, code, status in cases:
        outcome = await update(engine, draft, "evd_u")
        assert (outcome.refusal.code, outcome.refusal.status) == (code, status)
        # The not-found message for another scope's item is the missing item's message.
        if draft.knowledge_id == "knw_2":
            assert "knw_2" in outcome.refusal.message and home not in outcome.refusal.message
    await engine.write(lambda c: set_knowledge_status(c, "knw_1", "SUPERSEDED", base_time))
    outcome = await update(engine, update_draft(), "evd_u")
    assert (outcome.refusal.code, outcome.refusal.status) == ("KNOWLEDGE_NOT_ACTIVE", 409)
    assert await engine.read(lambda c: get_evidence(c, "evd_u")) is None
    assert await engine.read(lambda c: receipt_get(
        c, receipt_namespace_update, "update-session-01-turn-04", scope=home)) is None


async def test_two_updates_from_the_same_version_one_wins(engine):
    await add_item(engine)
    first = await update(engine, update_draft(idempotency_key="a"), "evd_a")
    second = await update(engine, update_draft(idempotency_key="b", title="新标题"), "evd_b")
    assert first.knowledge.version == 2
    assert second.refusal.code == "VERSION_CONFLICT"
    third = await update(engine, update_draft(idempotency_key="c", expected_version=2,
                                              title="新标题", body=None), "evd_c")
    assert (third.knowledge.version, third.knowledge.title) == (3, "新标题")
    assert third.knowledge.body == {"vendor": "国家电网", "amount": 230}


async def test_titles_at_and_over_their_limit(engine):
    await add_item(engine)
    at_limit = "题" * knowledge_title_characters_max
    ok = await update(engine, update_draft(title=at_limit, body=None), "evd_u1")
    assert ok.knowledge.title == at_limit
    with pytest.raises(refused):
        await update(engine, update_draft(title=at_limit + "题", body=None, expected_version=2,
                                          idempotency_key="k2"), "evd_u2")


# -- lifecycle contexts --------------------------------------------------------------------


def lifecycle(event: str, key: str | None = None, **changes) -> ContextDraft:
    values = dict(scope=alice, event=event, session_id="session-01", run_id="run-01",
                  turn_id="turn-04", occurred_at=base_time - 3600,
                  data={"summary": "压缩前的受控摘要"}, idempotency_key=key)
    values.update(changes)
    return ContextDraft(**values)


async def test_contexts_get_the_servers_tier_and_expire(engine):
    mid = await engine.write(lambda c: record_lifecycle(
        c, lifecycle("PRE_COMPRESS"), context_id="ctx_1", now=base_time))
    assert mid.response() == {"event": "PRE_COMPRESS", "context_id": "ctx_1",
                              "tier": "MID_TERM", "status": "ACTIVE",
                              "expires_at": int(base_time) + 604_800}
    short = await engine.write(lambda c: record_lifecycle(
        c, lifecycle("TURN_START"), context_id="ctx_2", now=base_time))
    assert short.context.tier == "SHORT_TERM"
    assert short.context.expires_at == int(base_time) + 86_400
    with pytest.raises(refused):
        await engine.write(lambda c: record_lifecycle(
            c, lifecycle("TURN_END", turn_id=None), context_id="ctx_3", now=base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: record_lifecycle(
            c, lifecycle("SESSION_END", data={}), context_id="ctx_3", now=base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: record_lifecycle(
            c, lifecycle("NAP"), context_id="ctx_3", now=base_time))
    # Events other than TURN may omit the turn id.
    await engine.write(lambda c: record_lifecycle(
        c, lifecycle("DELEGATION", turn_id=None), context_id="ctx_3", now=base_time))
    assert await engine.write(lambda c: mark_context_promoted(c, "ctx_1", "knw_9", base_time))
    assert not await engine.write(lambda c: mark_context_promoted(c, "ctx_1", "knw_9",
                                                                  base_time))
    assert await engine.write(lambda c: expire_contexts(c, base_time + 86_400)) == 1
    statuses = await engine.read(lambda c: [get_context(c, f"ctx_{n}").status for n in (1, 2, 3)])
    assert statuses == ["PROMOTED", "EXPIRED", "ACTIVE"]


# -- preferences ---------------------------------------------------------------------------


async def test_preferences_keep_every_version(engine):
    async def extract(value, now, category="OUTPUT_STYLE", confidence=0.85):
        return await engine.write(lambda c: upsert_preference(
            c, preference_id=f"pref_{now}", scope=home, category=category,
            key="output_style.compact", value=value, confidence=confidence,
            evidence_ids=["evd_1"], now=now))

    first, added = await extract({"enabled": False}, base_time)
    assert (first.id, first.version, added) == (f"pref_{base_time}", 1, True)
    same, added = await extract({"enabled": False}, base_time + 1, confidence=0.9)
    assert (same.id, same.version, same.confidence, added) == (first.id, 1, 0.9, False)
    await extract({"enabled": True}, base_time + 2)
    last, _ = await extract({"enabled": True, "detail_level": "high"}, base_time + 3)
    assert (last.id, last.version) == (first.id, 3)
    assert last.encode()["created_at"] == int(base_time)
    history = await engine.read(lambda c: preference_history(c, first.id))
    assert [entry.encode() for entry in history] == [
        {"version": 1, "value": {"enabled": False}, "updated_at": int(base_time)},
        {"version": 2, "value": {"enabled": True}, "updated_at": int(base_time) + 2},
        {"version": 3, "value": {"enabled": True, "detail_level": "high"},
         "updated_at": int(base_time) + 3}]
    assert [p.id for p in await engine.read(lambda c: list_preferences(c, home))] == [first.id]
    assert await engine.read(lambda c: list_preferences(c, alice)) == []
    assert await engine.read(lambda c: preference_history(c, "pref_nope")) == []
    with pytest.raises(refused):
        await extract({"enabled": 1}, base_time + 4, category="MOOD")


async def test_preference_limits_at_and_over_their_boundary(engine, monkeypatch):
    def put(key, value, now):
        return engine.write(lambda c: upsert_preference(
            c, preference_id=f"pref_{key}", scope=home, category="OP_HABIT", key=key,
            value=value, confidence=0.5, evidence_ids=[], now=now))

    await put("k" * stored_preference_key_characters_max, 1, base_time)
    with pytest.raises(refused):
        await put("k" * (stored_preference_key_characters_max + 1), 1, base_time)
    monkeypatch.setattr(_store, "preference_versions_max", 2)
    await put("v", 1, base_time)
    await put("v", 2, base_time + 1)
    with pytest.raises(refused):
        await put("v", 3, base_time + 2)
    assert preference_versions_max >= 1000


# -- conflicts -----------------------------------------------------------------------------


async def test_conflicts_derive_severity_and_track_pending_manual_ones(engine):
    await add_item(engine)
    medium = await engine.write(lambda c: insert_conflict(
        c, conflict_id="cfl_1", knowledge_id="knw_1", field="body.items[2].amount",
        old_value=156, new_value=186, resolution="NEW_WINS", now=base_time))
    assert (medium.severity, medium.pending, medium.resolved_at) == ("medium", False, base_time)
    assert await engine.read(lambda c: conflict_status_for_knowledge(c, ["knw_1", "knw_2"])) == {
        "knw_1": "resolved", "knw_2": "none"}
    manual = await engine.write(lambda c: insert_conflict(
        c, conflict_id="cfl_2", knowledge_id="knw_1", field="title", old_value="a",
        new_value="b", resolution="MANUAL", now=base_time + 1))
    assert (manual.severity, manual.pending) == ("high", True)
    assert await engine.read(lambda c: manual_conflicts_pending(c)) == 1
    assert await engine.read(lambda c: manual_conflicts_pending(c, alice)) == 0
    assert await engine.read(lambda c: conflict_status_for_knowledge(c, ["knw_1"])) == {
        "knw_1": "manual"}
    listed = await engine.read(lambda c: list_conflicts(c, home))
    assert [conflict.encode(title) for conflict, title in listed][0] == {
        "id": "cfl_2", "target_knowledge": "knw_1", "field": "title", "old_value": "a",
        "new_value": "b", "resolution": "MANUAL", "created_at": int(base_time) + 1,
        "knowledge_title": bill["title"], "severity": "high"}
    merged = await engine.write(lambda c: resolve_conflict(c, "cfl_2", "MERGE", base_time + 2))
    assert (merged.severity, merged.pending) == ("low", False)
    assert await engine.read(lambda c: manual_conflicts_pending(c)) == 0
    assert await engine.read(lambda c: list_conflicts(c, alice)) == []


async def test_the_conflict_list_stops_at_its_limit_newest_first(engine):
    """``/conflicts`` has no ``limit`` parameter: the store answers the newest
    ``conflicts_list_max``, whatever a caller asks for (at the limit, and one over it)."""
    await add_item(engine)

    def insert(c, first: int, count: int) -> None:
        for number in range(first, first + count):
            insert_conflict(c, conflict_id=f"cfl_{number:04d}", knowledge_id="knw_1", field="title",
                            old_value="a", new_value="b", resolution="MERGE", now=base_time + number)

    await engine.write(lambda c: insert(c, 0, conflicts_list_max))
    listed = await engine.read(lambda c: list_conflicts(c, home))
    assert len(listed) == conflicts_list_max
    await engine.write(lambda c: insert(c, conflicts_list_max, 1))
    listed = await engine.read(lambda c: list_conflicts(c, home, limit=conflicts_list_max + 100))
    assert len(listed) == conflicts_list_max
    assert listed[0][0].id == f"cfl_{conflicts_list_max:04d}" and listed[-1][0].id == "cfl_0001"


# -- forgetting ----------------------------------------------------------------------------


async def test_forget_lists_the_cascade_then_removes_it_for_good(engine):
    await add_item(engine)
    await add_item(engine, "evd_2", "knw_2")
    await update(engine, update_draft(), "evd_u1")
    await engine.write(lambda c: insert_conflict(
        c, conflict_id="cfl_1", knowledge_id="knw_1", field="f", old_value=1, new_value=2,
        resolution="MANUAL", now=base_time))
    # Evidence shared with a surviving item stays.
    await engine.write(lambda c: _store.link_evidence(c, "knw_2", "evd_1", base_time))
    plan = await engine.read(lambda c: forget_plan(c, ["knw_1", "knw_missing"]))
    assert plan.targets() == [{"type": "knowledge", "id": "knw_1", "title": bill["title"]}]
    assert plan.cascade() == {"evidence_count": 1, "relation_count": 1}
    assert plan.evidence_ids == ("evd_u1",)
    result = await engine.write(lambda c: forget_apply(c, ["knw_1"], base_time + 5))
    assert result.forgotten_ids == ["knw_1", "evd_u1"]
    assert await engine.read(lambda c: get_knowledge(c, "knw_1")) is None
    assert await engine.read(lambda c: get_evidence(c, "evd_u1")) is None
    assert await engine.read(lambda c: get_evidence(c, "evd_1")) is not None
    assert await engine.read(lambda c: knowledge_entities(c, "knw_1")) == []
    assert await engine.read(lambda c: list_conflicts(c)) == []
    assert await engine.read(lambda c: structuring_due(c, base_time + 10)) == []
    assert await engine.read(lambda c: forgotten_among(c, ["knw_1", "evd_u1", "knw_2"])) == {
        "knw_1", "evd_u1"}
    assert await engine.read(lambda c: evidence_ids_for_knowledge_many(c, ["knw_1", "knw_2"])) \
        == {"knw_1": [], "knw_2": ["evd_1", "evd_2"]}
    # The update's receipt stays: replaying it answers its first response, creates nothing.
    replay = await update(engine, update_draft(), "evd_u9")
    assert replay.replayed and await engine.read(lambda c: get_evidence(c, "evd_u9")) is None
    assert [item.id for item in await engine.read(lambda c: knowledge_in_scope(c, home))] == [
        "knw_2"]


async def test_forget_items_at_and_over_their_limit(engine):
    ids = [f"knw_{index}" for index in range(forget_items_per_call_max)]
    assert (await engine.read(lambda c: forget_plan(c, ids))).targets() == []
    with pytest.raises(refused):
        await engine.read(lambda c: forget_plan(c, [*ids, "knw_more"]))


async def test_forget_confirmations_expire_and_are_used_once(engine):
    await engine.write(lambda c: forget_request_put(
        c, request_id="fgt_1", command="忘记那张4月支出清单", scope=home, targets=["knw_1"],
        now=base_time, seconds=120))
    request, refusal = await engine.write(lambda c: forget_request_confirm(
        c, "fgt_1", base_time + 120))
    assert refusal is None and request.state == "CONFIRMED"
    _, again = await engine.write(lambda c: forget_request_confirm(c, "fgt_1", base_time + 121))
    assert (again.code, again.status) == ("REQUEST_NOT_FOUND", 404)
    await engine.write(lambda c: forget_request_put(
        c, request_id="fgt_2", command="忘记", scope=None, targets=[], now=base_time,
        seconds=120))
    _, late = await engine.write(lambda c: forget_request_confirm(c, "fgt_2", base_time + 120.5))
    assert (late.code, late.status) == ("CONFLICT_TIMEOUT", 408)


async def test_knowledge_listing_filters_scope_status_and_creation_time(engine):
    await add_item(engine)
    await add_item(engine, "evd_2", "knw_2", scope=alice)
    assert [item.id for item in await engine.read(lambda c: knowledge_in_scope(c, home))] == [
        "knw_1"]
    assert await engine.read(lambda c: knowledge_in_scope(
        c, home, created_since=base_time + 1)) == []
    await engine.write(lambda c: set_knowledge_status(c, "knw_1", "ARCHIVED", base_time))
    assert await engine.read(lambda c: knowledge_in_scope(c, home)) == []
    assert len(await engine.read(lambda c: knowledge_in_scope(c, home, status=None))) == 1
