"""The context texts over a real store: each ``/new_dialog`` section, unknown characters,
``/get_recent_history`` and ``/get_settings`` (with the legacy fallback), the chat-gap hint,
holidays, and followup topics with their cooldown (never marking anything surfaced)."""

from __future__ import annotations

import datetime

import pytest

from tests.actors.character.store_helpers import open_character_engine
from troupe.actors.character._context import (
    chat_gap_hint,
    followup_cooldown_seconds,
    followup_topics_max,
    load_context_snapshot,
    load_followup_topics,
    no_history_text,
    render_new_dialog,
    render_recent_history,
    render_settings,
)
from troupe.actors.character._holidays import (
    china_date,
    holiday_context,
    holidays_on,
    lunar_table_years,
)
from troupe.actors.character._protocol import HistoryMessage
from troupe.actors.character._store import (
    NewFact,
    NewPersonaEntry,
    NewReflection,
    add_facts,
    add_persona_entry,
    add_reflection,
    append_recent,
    append_time_indexed,
    ensure_character,
    record_surfaced,
    replace_recent,
    surfaced_times,
    transition_reflection,
    write_document,
)

hour = 3600.0
day = 24 * hour


def beijing(*parts: int) -> float:
    zone = datetime.timezone(datetime.timedelta(hours=8))
    return datetime.datetime(*parts, tzinfo=zone).timestamp()


now = beijing(2026, 6, 10, 20, 0)  # an ordinary day: no holiday within three days


@pytest.fixture
async def engine(nursery, tmp_path):
    return await open_character_engine(nursery, tmp_path)


async def full_character(engine, name: str = "小天") -> None:
    def write(connection):
        add_persona_entry(connection, name, NewPersonaEntry("persona_1", "小天是一只猫娘", "小天"), now - 9 * day)
        add_persona_entry(connection, name, NewPersonaEntry("persona_2", "主人喜欢吃寿司", "master"), now - 9 * day)
        add_reflection(connection, name, NewReflection("reflection_p", "主人最近工作很累"), now - 2 * day)
        add_reflection(connection, name, NewReflection("reflection_c", "主人喜欢晚上散步"), now - 3 * day)
        transition_reflection(connection, name, "reflection_c", "confirmed", now - 2 * day)
        add_reflection(connection, name, NewReflection("reflection_d", "主人讨厌香菜"), now - 3 * day)
        transition_reflection(connection, name, "reflection_d", "denied", now - 2 * day)
        add_facts(connection, name, [NewFact("fact_1", "主人下周要去上海")], now - 2 * hour)
        add_facts(connection, name, [NewFact("fact_0", "主人养了一只橘猫")], now - 3 * day)
        messages = [HistoryMessage("user", "今天好累啊"), HistoryMessage("assistant", "辛苦了，主人"),
                    HistoryMessage("user", ({"type": "text", "text": "给你看张图"}, {"type": "image_url"}))]
        append_recent(connection, name, messages, now - 5 * hour)
        append_time_indexed(connection, name, messages, now - 5 * hour)

    await engine.write(write)


async def snapshot(engine, name: str = "小天"):
    return await engine.read(lambda connection: load_context_snapshot(connection, name))


async def test_new_dialog_renders_every_section_in_order(engine) -> None:
    await full_character(engine)
    text = render_new_dialog(await snapshot(engine), now=now)
    assert text == "\n".join([
        "======小天的人设======",
        "【小天】",
        "- 小天是一只猫娘",
        "【主人】",
        "- 主人喜欢吃寿司",
        "",
        "======小天对主人的印象======",
        "- （已确认）主人喜欢晚上散步",
        "- （待确认，不要当作事实）主人最近工作很累",
        "",
        "======内心活动======",
        "小天最近记住了：",
        "- 主人下周要去上海",
        "",
        "======近期对话======",
        "主人：今天好累啊",
        "小天：辛苦了，主人",
        "主人：给你看张图",
        "",
        "======时间======",
        "距离上次和主人聊天已经过去了5小时。",
    ])
    assert "香菜" not in text  # denied reflections are not active
    assert "橘猫" not in text  # older than the inner-activity window


async def test_unknown_character(engine) -> None:
    assert await snapshot(engine, "nobody") is None
    assert render_new_dialog(None, now=now) == ""
    assert render_recent_history(None) == no_history_text
    assert render_settings(None) == ""
    assert await engine.read(lambda connection: load_followup_topics(connection, "nobody", now=now)) == []


async def test_known_but_empty_character(engine) -> None:
    await engine.write(lambda connection: ensure_character(connection, "空", now))
    empty = await snapshot(engine, "空")
    assert render_new_dialog(empty, now=now) == ""
    assert render_recent_history(empty) == no_history_text
    assert render_settings(empty) == ""


async def test_summary_master_name_and_history_string(engine) -> None:
    await full_character(engine)

    def compress(connection):
        replace_recent(connection, "小天", [HistoryMessage("user", "晚安")], {"summary": "之前聊了猫和寿司。"}, now - hour)
        write_document(connection, "小天", "settings", {"master_name": "阿明", "性格": "温柔"}, now)

    await engine.write(compress)
    state = await snapshot(engine)
    assert render_recent_history(state) == "（更早的对话摘要：之前聊了猫和寿司。）\n阿明：晚安"
    dialog = render_new_dialog(state, now=now)
    assert "======小天对阿明的印象======" in dialog and "【阿明】" in dialog
    assert "（更早的对话摘要：之前聊了猫和寿司。）\n阿明：晚安" in dialog


async def test_settings_with_persona_and_the_legacy_fallback(engine) -> None:
    await full_character(engine)
    settings = render_settings(await snapshot(engine))
    assert settings.startswith("======小天的人设======")
    assert "（已确认）主人喜欢晚上散步" in settings and "今天好累啊" not in settings

    def legacy(connection):
        write_document(connection, "旧", "settings", {"性格": "活泼", "爱好": ["唱歌"]}, now)

    await engine.write(legacy)
    assert render_settings(await snapshot(engine, "旧")) == "======旧的设定======\n性格: 活泼\n爱好: [\"唱歌\"]"


@pytest.mark.parametrize(
    ("gap", "hint"),
    [
        (None, ""),
        (29 * 60.0, ""),
        (30 * 60.0, "距离上次和主人聊天已经过去了30分钟。"),
        (hour + 5 * 60, "距离上次和主人聊天已经过去了1小时5分钟。"),
        (2 * day + 3 * hour, "距离上次和主人聊天已经过去了2天3小时。"),
        (7 * day - 1, "距离上次和主人聊天已经过去了6天23小时。"),
        (7 * day, "距离上次和主人聊天已经过去了7天。已经很久没有聊天了。"),
    ],
)
def test_chat_gap_hint(gap: float | None, hint: str) -> None:
    last = None if gap is None else now - gap
    assert chat_gap_hint(last, now) == hint


def test_holidays() -> None:
    assert holidays_on(datetime.date(2026, 10, 1)) == ["国庆节"]
    assert holidays_on(datetime.date(2026, 2, 17)) == ["春节"]
    assert holidays_on(datetime.date(2026, 9, 25)) == ["中秋节"]
    assert holidays_on(datetime.date(2031, 1, 1)) == ["元旦"]  # fixed days outside the table
    assert holidays_on(datetime.date(2026, 6, 10)) == []
    assert lunar_table_years == (2024, 2030)
    # Beijing dates: 2026-09-30 17:00 UTC is already 1 October in China.
    utc_evening = datetime.datetime(2026, 9, 30, 17, tzinfo=datetime.UTC).timestamp()
    assert china_date(utc_evening) == datetime.date(2026, 10, 1)
    assert holiday_context(utc_evening) == "今天是国庆节。"
    assert holiday_context(beijing(2026, 2, 15, 9)) == "明天（2月16日）是除夕。后天（2月17日）是春节。"
    assert holiday_context(now) == ""


async def test_new_dialog_carries_the_holiday(engine) -> None:
    await full_character(engine)
    text = render_new_dialog(await snapshot(engine), now=beijing(2026, 9, 28, 12))
    assert text.endswith("3天后（10月1日）是国庆节。")


async def test_followup_topics_respect_cooldown_and_mark_nothing(engine) -> None:
    await full_character(engine)
    topics = await engine.read(lambda connection: load_followup_topics(connection, "小天", now=now))
    assert [topic["reflection_id"] for topic in topics] == ["reflection_c", "reflection_p"]
    assert topics[0]["status"] == "confirmed" and topics[0]["last_surfaced_at"] is None
    assert await engine.read(lambda connection: surfaced_times(connection, "小天")) == {}
    await engine.write(lambda connection: record_surfaced(connection, "小天", ["reflection_c"], now - hour))
    later = await engine.read(lambda connection: load_followup_topics(connection, "小天", now=now))
    assert [topic["reflection_id"] for topic in later] == ["reflection_p"]
    after_cooldown = now - hour + followup_cooldown_seconds
    again = await engine.read(lambda connection: load_followup_topics(connection, "小天", now=after_cooldown))
    assert [topic["reflection_id"] for topic in again] == ["reflection_p", "reflection_c"]

    def many(connection):
        for index in range(followup_topics_max + 2):
            add_reflection(connection, "多", NewReflection(f"reflection_{index}", f"话题{index}"), now - index)

    await engine.write(many)
    bounded = await engine.read(lambda connection: load_followup_topics(connection, "多", now=now))
    assert [topic["reflection_id"] for topic in bounded] == [f"reflection_{index}" for index in range(followup_topics_max)]
