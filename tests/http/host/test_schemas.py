"""The plain-message fast path (``_plain_message``) never disagrees with the pydantic model:
for every document it either builds exactly the model's ``NewMessage`` or declines (None), so
that every accepted value and every error still comes from ``MessageIn``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from troupe.http.host._schemas import _message_adapter, _plain_message, parse_message_batch

base = {"sender": "小明", "content": "今晚看星星", "occurred_at": "2026-10-10T20:00:00+08:00", "dedupe_key": "k1"}

variants = [
    {},
    {"content": ""},
    {"occurred_at": "2026-10-10 20:00:00Z"},
    {"occurred_at": "2026-10-10T20:00:00.123456789+08:00"},
    {"occurred_at": "2026-10-10T20:00:00"},
    {"occurred_at": "yesterday"},
    {"occurred_at": "2026-10-10T20:00:00+08:00" + " " * 76},
    {"sender": "s" * 200}, {"sender": "s" * 201}, {"sender": 7}, {"sender": None}, {"sender": "a\ud800"},
    {"content": "x\udfff"}, {"content": 1.5}, {"content": "星" * 40000},
    {"dedupe_key": ""}, {"dedupe_key": "d" * 300}, {"dedupe_key": "d" * 301}, {"dedupe_key": True},
    {"kind": "event"}, {"kind": "self_output"}, {"kind": "chat"}, {"kind": None}, {"kind": 1},
    {"account_id": None}, {"account_id": "u" * 200}, {"account_id": "u" * 201}, {"account_id": 5},
    {"quote_author": "甲", "quote_author_account_id": "u1", "quote_content": "原话"},
    {"quote_content": "q" * 32_768}, {"quote_content": "q" * 32_769},
    {"scene_identity": "群主", "platform": "qq"}, {"platform": "p" * 101},
    {"entry_name": "A 群", "entry_kind": "group"}, {"entry_kind": "k" * 101},
    {"media_ids": []}, {"media_ids": ["m1", "m2"]}, {"media_ids": ["m1", "m1"]}, {"media_ids": [""]},
    {"media_ids": ["m" * 101]}, {"media_ids": [f"m{index}" for index in range(101)]},
    {"media_ids": None}, {"media_ids": "m1"}, {"media_ids": [1]}, {"media_ids": ("m1",)},
    {"pace": "quick"}, {"pace": "standard"}, {"pace": "warp"}, {"pace": None}, {"pace": 3},
    {"pace": {"count": 5, "idle_seconds": 10, "max_wait_seconds": 60}},
    {"host": "someone else", "unknown": [1, 2]},
]


@pytest.mark.parametrize("variant", variants, ids=[repr(variant)[:60] for variant in variants])
def test_the_fast_path_agrees_with_the_model(variant):
    document = {**base, **variant}
    plain = _plain_message(document)
    try:
        expected = _message_adapter.validate_python(document).to_new_message()
    except ValidationError:
        assert plain is None
        return
    assert plain is None or plain == expected


@pytest.mark.parametrize("removed", ["sender", "content", "occurred_at", "dedupe_key"])
def test_a_missing_required_field_is_left_to_the_model(removed):
    document = {key: value for key, value in base.items() if key != removed}
    assert _plain_message(document) is None
    assert _plain_message([document]) is None and _plain_message("text") is None


def test_plain_documents_take_the_fast_path_and_keep_input_order():
    messages = parse_message_batch([{**base, "dedupe_key": f"k{index}"} for index in range(3)])
    assert [message.dedupe_key for message in messages] == ["k0", "k1", "k2"]
    assert _plain_message(base) is not None


@pytest.mark.parametrize("variant", [
    {}, {"content": ""}, {"kind": "event"}, {"pace": "quick"}, {"media_ids": ["m1", "m2"]},
    {"quote_content": "q" * 32_768, "account_id": "u1"}, {"occurred_at": "2026-10-10 20:00:00Z"},
    {"host": "ignored"},
])
def test_common_valid_messages_do_take_the_fast_path(variant):
    assert _plain_message({**base, **variant}) is not None
