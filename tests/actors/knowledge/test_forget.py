"""``/forget``: targets from a natural-language command, the confirmation step, expiry (408),
tokens used once, the cascade removed for good (knowledge, evidence, relations, vectors),
and the ``forget_confirmation`` event."""

from __future__ import annotations

from troupe.actors.knowledge._forget import command_terms, confirm_forget, plan_forget
from troupe.actors.knowledge._protocol import (
    ForgetConfirmation,
    KnowledgeRefused,
    forget_confirmation_seconds,
)

from .recall_helpers import open_bench

bill = {"title": "2026年4月家庭支出清单",
        "body": {"items": [{"category": "水电燃气", "vendor": "国家电网", "amount": 210}]},
        "relations": [{"from": "国家电网", "to": "水电燃气", "type": "BELONG_TO"},
                      {"from": "国家电网", "to": "电费", "type": "ISSUES"}]}
command = "忘记那张4月支出清单"


def test_command_terms_drop_the_filler():
    assert command_terms(command) == ["4", "月支", "支出", "出清", "清单"]
    assert command_terms("Please forget the April expense list") == ["april", "expense", "list"]
    assert command_terms("忘记") == []


async def setup(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    item = await bench.remember(bill, scope="shared:home", source_type="OCR")
    other = await bench.remember({"title": "周末计划", "body": "周六去爬山"}, scope="shared:home")
    return bench, item, other


async def test_plan_lists_targets_and_cascade(nursery, tmp_path):
    bench, item, _ = await setup(nursery, tmp_path)
    plan = await plan_forget(bench.engine, bench.index, bench.env, command)
    body = plan.encode()
    assert body["targets"] == [{"type": "knowledge", "id": item.knowledge_id,
                                "title": "2026年4月家庭支出清单"}]
    assert body["cascade"] == {"evidence_count": 1, "relation_count": 2}
    assert body["irreversible"] is True
    assert plan.expires_at == int(bench.clock.now) + forget_confirmation_seconds
    assert await bench.rows("SELECT count(*) FROM knowledge_items") == [(2,)]  # nothing removed


async def test_confirm_removes_for_good(nursery, tmp_path):
    bench, item, other = await setup(nursery, tmp_path)
    plan = await plan_forget(bench.engine, bench.index, bench.env, command)
    done, event = await confirm_forget(bench.engine, bench.index, bench.env, command,
                                       confirmation_token=plan.confirmation_token)
    assert done.encode()["forgotten_ids"] == [item.knowledge_id, item.evidence_id]
    assert isinstance(event, ForgetConfirmation)
    data = event.encode()["data"]
    assert data["targets"][-1] == {"type": "relation", "count": 2}
    assert data["expires_at"] == plan.expires_at
    assert await bench.rows("SELECT id FROM knowledge_items") == [(other.knowledge_id,)]
    assert await bench.rows("SELECT count(*) FROM knowledge_evidence WHERE id = ?", item.evidence_id) == [(0,)]
    assert await bench.rows("SELECT count(*) FROM knowledge_relations") == [(0,)]
    # Vectors and text are gone from the index; recall never returns the item again.
    assert await bench.rows(
        "SELECT count(*) FROM retrieval_vectors v JOIN retrieval_items i ON i.id = v.item_id "
        "WHERE i.key LIKE ?", item.knowledge_id + "%") == [(0,)]
    hits = await bench.index.recall("4月支出清单 国家电网", scopes=None, limit=10)
    assert item.knowledge_id not in [hit.knowledge_id for hit in hits]
    # The token was used once.
    again = await confirm_forget(bench.engine, bench.index, bench.env, command,
                                 confirmation_token=plan.confirmation_token)
    assert isinstance(again, KnowledgeRefused) and again.status == 404


async def test_confirmation_by_command_and_expiry_boundary(nursery, tmp_path):
    bench, item, _ = await setup(nursery, tmp_path)
    plan = await plan_forget(bench.engine, bench.index, bench.env, command)
    bench.clock.now = plan.expires_at + 1
    expired = await confirm_forget(bench.engine, bench.index, bench.env, command)
    assert isinstance(expired, KnowledgeRefused)
    assert (expired.code, expired.status) == ("CONFLICT_TIMEOUT", 408)
    assert await bench.rows("SELECT count(*) FROM knowledge_items WHERE id = ?", item.knowledge_id) == [(1,)]
    plan = await plan_forget(bench.engine, bench.index, bench.env, command)
    bench.clock.now = plan.expires_at  # exactly at the deadline: still valid
    done, _ = await confirm_forget(bench.engine, bench.index, bench.env, command)
    assert item.knowledge_id in done.forgotten_ids


async def test_a_token_for_another_command_is_refused(nursery, tmp_path):
    bench, item, _ = await setup(nursery, tmp_path)
    plan = await plan_forget(bench.engine, bench.index, bench.env, command)
    refused = await confirm_forget(bench.engine, bench.index, bench.env, "忘记周末计划",
                                   confirmation_token=plan.confirmation_token)
    assert isinstance(refused, KnowledgeRefused) and refused.code == "REQUEST_NOT_FOUND"
    assert item.knowledge_id


async def test_confirm_without_a_plan_resolves_afresh(nursery, tmp_path):
    bench, item, other = await setup(nursery, tmp_path)
    done, _ = await confirm_forget(bench.engine, bench.index, bench.env, "忘记周末计划")
    assert done.forgotten_ids == (other.knowledge_id, other.evidence_id)


async def test_scope_narrows_the_targets(nursery, tmp_path):
    bench, item, _ = await setup(nursery, tmp_path)
    plan = await plan_forget(bench.engine, bench.index, bench.env, command, scope="user:alice")
    assert plan.targets == ()
    assert item.knowledge_id


async def test_vague_similarity_selects_nothing(nursery, tmp_path):
    bench, _, _ = await setup(nursery, tmp_path)
    plan = await plan_forget(bench.engine, bench.index, bench.env, "忘记我的护照号码")
    assert plan.targets == () and plan.evidence_count == 0
