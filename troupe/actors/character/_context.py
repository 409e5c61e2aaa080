"""The texts a character hands to its companion: ``/new_dialog``, ``/get_recent_history``,
``/get_settings``, and the ``/followup_topics`` candidates.

Why it exists: before a new model session the main server asks for ONE text/plain prompt
context — who the character is (persona), what it has been thinking about the user (active
reflections, pending ones marked as unconfirmed), what it has just learnt (inner activity),
what was said lately (the compressed summary and the recent messages), how long the user has
been away (the chat-gap hint) and what day it is (holiday context).  Semantic recall is
deliberately NOT here: the model asks ``/query_memory`` itself.

Shape: ``load_context_snapshot`` is one sync function over a connection, so the actor reads
everything in ONE engine read (after any running renew/settle finished: the settle lock is the
actor's) and the text can never mix two states; the ``render_*`` functions are pure over that
snapshot and ``now`` (the Env's wall clock), so the same state renders the same bytes.

Language: the contract's companion speaks Chinese, so the texts are Chinese; the user is
called ``主人`` unless the character's settings document names them (``master_name``).
Unknown characters: ``/new_dialog`` and ``/get_settings`` answer ``""``,
``/get_recent_history`` the "no history" string ``no_history_text``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import apsw

from ._holidays import holiday_context
from ._store import (
    PersonaEntry,
    RecentMessage,
    Reflection,
    character_exists,
    content_text,
    last_conversation_at,
    list_facts,
    list_persona_entries,
    list_reflections,
    read_document,
    read_recent,
    read_recent_meta,
    reflection_statuses_active,
    surfaced_times,
)
from ._time_tokens import format_wall_time

no_history_text = "暂无历史记录。"
"""``/get_recent_history`` for an unknown character or an empty history."""
master_name_default = "主人"
history_summary_meta_key = "summary"
"""The key of the compressed-history summary in the recent-history metadata."""

context_persona_entries_max = 200
context_reflections_max = 20
context_history_messages_max = 40
context_message_characters_max = 1_000
inner_activity_facts_max = 5
inner_activity_window_seconds = 24 * 3600.0
"""Facts learnt this recently are the character's "inner activity"."""
chat_gap_hint_min_seconds = 30 * 60.0
"""Below this the user never left: no hint."""
chat_gap_long_seconds = 7 * 24 * 3600.0
followup_topics_max = 5
followup_cooldown_seconds = 24 * 3600.0
"""A reflection surfaced by proactive chat is not offered again for this long."""

assert chat_gap_hint_min_seconds < chat_gap_long_seconds


@dataclass(frozen=True)
class ContextSnapshot:
    """What the context texts need of one character, read in one transaction."""

    character_name: str
    persona_entries: tuple[PersonaEntry, ...] = ()
    reflections: tuple[Reflection, ...] = ()
    """Active (pending and confirmed), oldest first."""
    recent_history: tuple[RecentMessage, ...] = ()
    history_summary: str = ""
    recent_facts: tuple[Any, ...] = ()
    """The newest active facts (``_store.Fact``), newest first."""
    last_conversation_at: float | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    persona_document: Mapping[str, Any] | None = None

    @property
    def master_name(self) -> str:
        name = self.settings.get("master_name") if self.settings else None
        return name if isinstance(name, str) and name.strip() else master_name_default


def load_context_snapshot(connection: apsw.Connection, name: str) -> ContextSnapshot | None:
    """Everything ``render_*`` needs, or ``None`` for an unknown character (run it inside
    one ``engine.read``)."""
    if not character_exists(connection, name):
        return None
    meta = read_recent_meta(connection, name)
    summary = meta.get(history_summary_meta_key)
    return ContextSnapshot(
        character_name=name,
        persona_entries=tuple(list_persona_entries(connection, name, limit=context_persona_entries_max)),
        reflections=tuple(list_reflections(connection, name, reflection_statuses_active)),
        recent_history=tuple(read_recent(connection, name, context_history_messages_max)),
        history_summary=summary if isinstance(summary, str) else "",
        recent_facts=tuple(list_facts(connection, name, limit=inner_activity_facts_max)),
        last_conversation_at=last_conversation_at(connection, name),
        settings=read_document(connection, name, "settings") or {},
        persona_document=read_document(connection, name, "persona"),
    )


def _cut(text: str, characters_max: int = context_message_characters_max) -> str:
    text = text.strip()
    return text if len(text) <= characters_max else text[: characters_max - 1] + "…"


def _speaker(role: str, snapshot: ContextSnapshot) -> str:
    if role == "user":
        return snapshot.master_name
    if role == "assistant":
        return snapshot.character_name
    return "系统"


# -- sections ---------------------------------------------------------------------------------


def persona_section(snapshot: ContextSnapshot) -> str:
    """The persona entries grouped by section (``""`` when there are none)."""
    entries = [entry for entry in snapshot.persona_entries if entry.status == "active"]
    if not entries:
        return ""
    lines = [f"======{snapshot.character_name}的人设======"]
    by_section: dict[str, list[str]] = {}
    for entry in entries:
        by_section.setdefault(entry.section, []).append(_cut(entry.text))
    for section, texts in by_section.items():
        label = snapshot.master_name if section == "master" else section
        lines.append(f"【{label}】")
        lines.extend(f"- {text}" for text in texts)
    return "\n".join(lines)


def reflections_section(snapshot: ContextSnapshot) -> str:
    """Active reflections, newest last; pending ones are marked as not yet confirmed."""
    active = [r for r in snapshot.reflections if r.status in reflection_statuses_active]
    if not active:
        return ""
    lines = [f"======{snapshot.character_name}对{snapshot.master_name}的印象======"]
    for reflection in active[-context_reflections_max:]:
        mark = "（已确认）" if reflection.status == "confirmed" else "（待确认，不要当作事实）"
        lines.append(f"- {mark}{_cut(reflection.text)}")
    return "\n".join(lines)


def inner_activity_section(snapshot: ContextSnapshot, *, now: float) -> str:
    """What the character learnt in the last ``inner_activity_window_seconds``."""
    recent = [
        fact
        for fact in snapshot.recent_facts
        if now - fact.created_at <= inner_activity_window_seconds
    ][:inner_activity_facts_max]
    if not recent:
        return ""
    lines = ["======内心活动======", f"{snapshot.character_name}最近记住了："]
    lines.extend(f"- {_cut(fact.text)}" for fact in reversed(recent))
    return "\n".join(lines)


def history_lines(snapshot: ContextSnapshot) -> list[str]:
    lines = []
    for message in snapshot.recent_history[-context_history_messages_max:]:
        text = _cut(content_text(message.content))
        if text:
            lines.append(f"{_speaker(message.role, snapshot)}：{text}")
    return lines


def history_section(snapshot: ContextSnapshot) -> str:
    lines = history_lines(snapshot)
    if not lines and not snapshot.history_summary:
        return ""
    section = ["======近期对话======"]
    if snapshot.history_summary:
        section.append(f"（更早的对话摘要：{_cut(snapshot.history_summary, 4 * context_message_characters_max)}）")
    section.extend(lines)
    return "\n".join(section)


def chat_gap_hint(last_at: float | None, now: float, master_name: str = master_name_default) -> str:
    """How long the user has been away, in words (``""`` under half an hour or when there
    was no conversation yet)."""
    if last_at is None:
        return ""
    gap = now - last_at
    if gap < chat_gap_hint_min_seconds:
        return ""
    days, remainder = divmod(int(gap), 24 * 3600)
    hours, remainder = divmod(remainder, 3600)
    minutes = remainder // 60
    if days:
        span = f"{days}天" + (f"{hours}小时" if hours else "")
    elif hours:
        span = f"{hours}小时" + (f"{minutes}分钟" if minutes else "")
    else:
        span = f"{minutes}分钟"
    hint = f"距离上次和{master_name}聊天已经过去了{span}。"
    if gap >= chat_gap_long_seconds:
        hint += "已经很久没有聊天了。"
    return hint


def time_section(snapshot: ContextSnapshot, *, now: float) -> str:
    parts = [part for part in (chat_gap_hint(snapshot.last_conversation_at, now, snapshot.master_name),
                               holiday_context(now)) if part]
    if not parts:
        return ""
    return "\n".join(["======时间======", *parts])


# -- the three texts -------------------------------------------------------------------------------


def render_new_dialog(snapshot: ContextSnapshot | None, *, now: float) -> str:
    """The ``/new_dialog`` text/plain context (``""`` for an unknown character)."""
    if snapshot is None:
        return ""
    sections = (
        persona_section(snapshot),
        reflections_section(snapshot),
        inner_activity_section(snapshot, now=now),
        history_section(snapshot),
        time_section(snapshot, now=now),
    )
    return "\n\n".join(section for section in sections if section)


def render_recent_history(snapshot: ContextSnapshot | None) -> str:
    """``/get_recent_history``: the formatted history, or ``no_history_text``."""
    if snapshot is None:
        return no_history_text
    lines = history_lines(snapshot)
    if snapshot.history_summary:
        lines.insert(0, f"（更早的对话摘要：{_cut(snapshot.history_summary, 4 * context_message_characters_max)}）")
    return "\n".join(lines) if lines else no_history_text


def render_settings(snapshot: ContextSnapshot | None) -> str:
    """``/get_settings``: persona and active reflections; without persona entries, the
    legacy settings document rendered as ``key: value`` lines; ``""`` when unknown."""
    if snapshot is None:
        return ""
    persona = persona_section(snapshot)
    if not persona:
        persona = legacy_settings_text(snapshot)
    return "\n\n".join(part for part in (persona, reflections_section(snapshot)) if part)


def legacy_settings_text(snapshot: ContextSnapshot) -> str:
    """The old settings renderer: the settings document, one ``key: value`` per line."""
    document = snapshot.settings or {}
    if not document:
        return ""
    lines = [f"======{snapshot.character_name}的设定======"]
    for key, value in document.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines.append(f"{key}: {_cut(shown)}")
    return "\n".join(lines)


# -- followup topics --------------------------------------------------------------------------------


def followup_topics(
    reflections: Sequence[Reflection],
    surfaced: Mapping[str, float],
    *,
    now: float,
    limit: int = followup_topics_max,
    cooldown_seconds: float = followup_cooldown_seconds,
) -> list[dict[str, Any]]:
    """Proactive-chat candidates: active reflections not surfaced within the cooldown;
    never-surfaced first, confirmed before pending, newest first.  Marks NOTHING surfaced
    (the caller reports what it used through ``/record_surfaced``)."""
    candidates = [
        reflection
        for reflection in reflections
        if reflection.status in reflection_statuses_active
        and now - surfaced.get(reflection.id, float("-inf")) >= cooldown_seconds
    ]
    candidates.sort(
        key=lambda reflection: (
            reflection.id in surfaced,
            reflection.status != "confirmed",
            -reflection.created_at,
            reflection.id,
        )
    )
    return [
        {
            "reflection_id": reflection.id,
            "text": reflection.text,
            "status": reflection.status,
            "entity": reflection.entity,
            "created_at": format_wall_time(reflection.created_at),
            "last_surfaced_at": format_wall_time(surfaced.get(reflection.id)),
        }
        for reflection in candidates[:limit]
    ]


def load_followup_topics(connection: apsw.Connection, name: str, *, now: float) -> list[dict[str, Any]]:
    """``followup_topics`` over the store, in one read (``[]`` for an unknown character)."""
    if not character_exists(connection, name):
        return []
    return followup_topics(
        list_reflections(connection, name, reflection_statuses_active),
        surfaced_times(connection, name),
        now=now,
    )


__all__ = [
    "ContextSnapshot",
    "chat_gap_hint",
    "context_history_messages_max",
    "followup_cooldown_seconds",
    "followup_topics",
    "followup_topics_max",
    "history_summary_meta_key",
    "legacy_settings_text",
    "load_context_snapshot",
    "load_followup_topics",
    "no_history_text",
    "render_new_dialog",
    "render_recent_history",
    "render_settings",
]
