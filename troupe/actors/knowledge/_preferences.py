"""Preferences: ``/preference/extract`` through the Model port, ``/preferences``, history.

Why it exists: the agent should follow the user's habits ("请保持回答简洁", "每次操作前先确认",
"不要把密码发给任何人") without the user repeating them.  Extraction reads the named evidence,
asks the Model port for preferences in JSON (``{"preferences": [{category, key, value,
confidence}]}``) and, when the model cannot (the LocalModel, or any failure), uses the local
rules below; either way each preference is validated (category one of ``OP_HABIT``,
``OUTPUT_STYLE``, ``SECURITY_POLICY``; a dotted key; a JSON object value; confidence in
[0, 1]).  Storing is the store's job: the same ``(scope, key)`` gets a new version only when
its value changed, and every version is kept for ``/preference/{id}/history``.

Local rules (deterministic, Chinese and English): output style (简洁/concise →
``output_style.compact``, 详细/detailed → ``output_style.detail_level``, language), operating
habits (先确认/confirm first → ``op_habit.confirm_before_action``, 备份 → ``op_habit.backup``),
security policy (不要保存/发送 密码 → ``security_policy.no_secrets``).  Negations flip the value.

Sensitive evidence (``sensitivity > 0``) is not read: a preference is shown to the agent, and
its value could carry the secret.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import trio

from troupe.models import ChatMessage, CompletionRequest, ModelError

from ._protocol import (
    ExtractedPreference,
    KnowledgeRefused,
    PreferenceCategory,
    PreferencesExtracted,
    preference_categories,
    preference_evidence_ids_max,
)
from ._store import (
    Evidence,
    evidence_side_bytes_max,
    get_evidence_many,
    stored_preference_key_characters_max,
    upsert_preference,
)
from ._structuring import body_text

Category = PreferenceCategory
"""The protocol's ``PreferenceCategory`` (one definition)."""
categories: tuple[str, ...] = preference_categories
extract_evidence_ids_max = preference_evidence_ids_max
preferences_per_extraction_max = 32
preference_key_characters_max = stored_preference_key_characters_max
preference_value_characters_max = 2_000
"""A value longer than this (as JSON) is not stored."""

assert preference_value_characters_max * 4 <= evidence_side_bytes_max, "a kept value always fits the store"
local_rule_confidence = 0.75
extraction_model_timeout_seconds = 20.0
evidence_text_characters_max = 20_000


_key_pattern = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+")
_negation = re.compile(r"不要|别|不用|无需|不需要|禁止|\b(?:don't|do not|never|no need to|stop)\b",
                       re.IGNORECASE)


@dataclass(frozen=True)
class _Rule:
    category: Category
    key: str
    pattern: re.Pattern[str]
    value: dict[str, Any]
    negatable: bool = True


_rules: tuple[_Rule, ...] = (
    _Rule("OUTPUT_STYLE", "output_style.compact",
          re.compile(r"简洁|简短|简明|精简|\b(?:concise|brief|short answers?|terse)\b", re.I),
          {"enabled": True}),
    _Rule("OUTPUT_STYLE", "output_style.detail_level",
          re.compile(r"详细|详尽|具体一点|\b(?:detailed|in detail|thorough)\b", re.I),
          {"detail_level": "high"}),
    _Rule("OUTPUT_STYLE", "output_style.language",
          re.compile(r"用中文|说中文|中文回答|\b(?:in chinese)\b", re.I), {"language": "zh"},
          negatable=False),
    _Rule("OUTPUT_STYLE", "output_style.language",
          re.compile(r"用英文|说英文|英文回答|\b(?:in english)\b", re.I), {"language": "en"},
          negatable=False),
    _Rule("OP_HABIT", "op_habit.confirm_before_action",
          re.compile(r"先(?:确认|问我|征求)|执行前.{0,6}确认|\bconfirm (?:first|before)|ask (?:me )?before",
                     re.I),
          {"enabled": True}),
    _Rule("OP_HABIT", "op_habit.backup_before_change",
          re.compile(r"先备份|备份一下|\bback ?up (?:first|before)", re.I), {"enabled": True}),
    _Rule("SECURITY_POLICY", "security_policy.no_secrets",
          re.compile(r"(?:保存|记住|发送|上传|分享|外传).{0,6}(?:密码|密钥|口令|验证码)|"
                     r"(?:密码|密钥|口令).{0,6}(?:保存|记住|发送|上传|分享|外传)|"
                     r"\b(?:store|save|send|share)\b.{0,20}\b(?:passwords?|secrets?|keys?)\b", re.I),
          {"enabled": True}, negatable=False),
)


def local_preferences(text: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The local rules' ``(category, key, value)`` found in one text (pure).  A negated
    style or habit ("不要太详细", "don't ask before") gets ``enabled: false`` /
    ``detail_level: "low"``; the security rule is stated negatively by nature ("不要保存密码")."""
    found: dict[str, tuple[str, str, dict[str, Any]]] = {}
    for sentence in re.split(r"[。！？!?；;\n]+|(?<=[.])\s+", text[:evidence_text_characters_max]):
        for rule in _rules:
            match = rule.pattern.search(sentence)
            if match is None:
                continue
            value = dict(rule.value)
            if rule.negatable and _negation.search(sentence[: match.start()]):
                value = {key: (not item if isinstance(item, bool) else "low")
                         for key, item in value.items()}
            found[rule.key] = (rule.category, rule.key, value)
    return list(found.values())


def preference_problem(candidate: Any) -> str | None:
    """Why a model-proposed preference is rejected, or ``None``."""
    if not isinstance(candidate, dict):
        return "not an object"
    if candidate.get("category") not in categories:
        return "unknown category"
    key = candidate.get("key")
    if not isinstance(key, str) or len(key) > preference_key_characters_max or not _key_pattern.fullmatch(key):
        return "key is not a dotted lower-case name"
    value = candidate.get("value")
    if not isinstance(value, dict) or not value:
        return "value is not a non-empty object"
    if len(json.dumps(value, ensure_ascii=False)) > preference_value_characters_max:
        return "value is too long"
    confidence = candidate.get("confidence", local_rule_confidence)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        return "confidence is not in [0, 1]"
    return None


def evidence_text(evidence: Evidence) -> str:
    """What the rules and the model read of an evidence row (a turn: the user's words only;
    the assistant's "好的" states nobody's preference)."""
    raw = evidence.raw
    if evidence.source_type == "CONVERSATION" and isinstance(raw, dict):
        return str(raw.get("user", ""))
    return body_text(raw)


_instruction = (
    "Extract the user's stable preferences from the text. Answer one JSON object: "
    '{"preferences": [{"category": "OP_HABIT|OUTPUT_STYLE|SECURITY_POLICY", '
    '"key": "dotted.lower_case.name", "value": {...}, "confidence": 0..1}]}. '
    "Only preferences the text states."
)


async def _model_preferences(model: Any, text: str) -> list[dict[str, Any]] | None:
    """The model's proposals, or ``None`` when the model cannot converse or failed."""
    capabilities = getattr(model, "capabilities", None)
    if model is None or (capabilities is not None and "converse" not in capabilities):
        return None
    request = CompletionRequest(
        messages=(ChatMessage("system", _instruction), ChatMessage("user", text)),
        response_format="json",
    )
    try:
        with trio.move_on_after(extraction_model_timeout_seconds):
            completion = await model.complete(request)
            answer = json.loads(completion.text)
            proposals = answer.get("preferences") if isinstance(answer, dict) else None
            if isinstance(proposals, list):
                return [item for item in proposals if preference_problem(item) is None]
    except (ModelError, ValueError):
        pass
    return None


async def extract_preferences(
    engine: Any, env: Any, evidence_ids: Sequence[str]
) -> PreferencesExtracted | KnowledgeRefused:
    """Runs one ``/preference/extract``: reads the evidence (any unknown id → 404
    ``NOT_FOUND``, naming it), extracts per evidence (model port, local rules as fallback),
    stores new versions in one write, returns what was extracted (a value that did not change
    keeps its version)."""
    started = env.clock.monotonic()
    ids = list(dict.fromkeys(evidence_ids))
    assert 0 < len(ids) <= extract_evidence_ids_max
    found = await engine.read(lambda connection: get_evidence_many(connection, ids))
    missing = [evidence_id for evidence_id in ids if evidence_id not in found]
    if missing:
        return KnowledgeRefused("NOT_FOUND", f"evidence {missing[0]!r} not found")
    proposals: dict[tuple[str, str], tuple[str, dict[str, Any], float, list[str]]] = {}
    for evidence_id in ids:
        evidence = found[evidence_id]
        if evidence.sensitivity > 0:
            continue
        text = evidence_text(evidence)
        proposed = await _model_preferences(env.model, text)
        if proposed is None:
            proposed = [
                {"category": category, "key": key, "value": value, "confidence": local_rule_confidence}
                for category, key, value in local_preferences(text)
            ]
        for item in proposed:
            slot = (evidence.scope, item["key"])
            earlier = proposals.get(slot)
            sources = [*(earlier[3] if earlier else []), evidence_id]
            proposals[slot] = (item["category"], item["value"],
                               float(item.get("confidence", local_rule_confidence)), sources)
            if len(proposals) >= preferences_per_extraction_max:
                break
    new_ids = [env.ids.new_id("pref_") for _ in proposals]
    now = env.clock.wall()

    def write(connection: apsw.Connection) -> list[ExtractedPreference]:
        extracted = []
        for preference_id, ((scope, key), (category, value, confidence, sources)) in zip(
            new_ids, proposals.items(), strict=True
        ):
            stored, _ = upsert_preference(
                connection, preference_id=preference_id, scope=scope, category=category, key=key,
                value=value, confidence=round(confidence, 4), evidence_ids=sources, now=now,
            )
            extracted.append(ExtractedPreference(
                id=stored.id, category=stored.category, key=stored.key, value=stored.value,
                confidence=stored.confidence,
            ))
        return extracted

    extracted = await engine.write(write) if proposals else []
    return PreferencesExtracted(
        extracted_preferences=tuple(extracted),
        latency_ms=max(0, round((env.clock.monotonic() - started) * 1000)),
    )


__all__ = [
    "evidence_text",
    "extract_evidence_ids_max",
    "extract_preferences",
    "extraction_model_timeout_seconds",
    "local_preferences",
    "local_rule_confidence",
    "preference_problem",
    "preference_value_characters_max",
    "preferences_per_extraction_max",
]
