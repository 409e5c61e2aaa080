"""The local sensitivity detector: what it finds (and at which level), what it must not flag,
structured values walked with their keys, and failing closed on what it cannot read."""

from __future__ import annotations

import pytest

from troupe.actors.knowledge import (
    FailingSensitivityDetector,
    LocalSensitivityDetector,
    SensitivityCheckFailed,
    local_sensitivity_detector,
    sensitivity_scan_characters_max,
    sensitivity_scan_depth_max,
    text_categories,
)

detect = local_sensitivity_detector.detect


@pytest.mark.parametrize(("text", "category", "level"), [
    ("我的手机号是13812345678", "phone_number", 1),
    ("call +86 138-1234-5678 tonight", "phone_number", 1),
    ("office +44 20 7946 0958", "phone_number", 1),
    ("身份证 11010519491231002X", "id_number", 2),
    ("card 4111 1111 1111 1111 expires soon", "bank_card", 2),
    ("工资卡 6222021234567890128", "bank_card", 2),
    ("wifi password: hunter22", "password", 3),
    ("邮箱密码是abc123", "password", 3),
    ("OPENAI key sk-abcdefghijklmnop1234", "secret_key", 3),
    ("AKIAIOSFODNN7EXAMPLE", "secret_key", 3),
    ("-----BEGIN RSA PRIVATE KEY-----", "secret_key", 3),
    ("api_key = 0123456789abcdef", "secret_key", 3),
])
def test_each_rule_finds_its_category_at_its_level(text, category, level):
    verdict = detect({"note": text})
    assert category in verdict.categories
    assert verdict.sensitivity == level and verdict.is_sensitive


@pytest.mark.parametrize("text", [
    "2026年4月家庭支出清单：电费 210 元，水费 68.50 元",
    "occurred_at 1788393600 and 1788393600123",
    "order 11010519491231002Y",                # checksum fails
    "card 4111 1111 1111 1112",                # Luhn fails
    "请保持回答简洁",
    "the password policy changed",
    "session-01:turn-03",
])
def test_ordinary_content_is_not_sensitive(text):
    verdict = detect({"user": text, "amount": 434.5, "ok": True, "none": None})
    assert verdict.sensitivity == 0 and verdict.categories == ()


def test_keys_name_secrets_in_structured_raw():
    assert detect({"password": "x"}).categories == ("password",)
    assert detect({"body": {"credentials": [{"API-Key": "k"}]}}).categories == ("secret_key",)
    assert detect({"password": ""}).sensitivity == 0
    assert detect({"password": None}).sensitivity == 0


def test_the_verdict_is_the_highest_level_with_sorted_categories():
    verdict = detect(["13812345678", {"pwd": "x"}])
    assert verdict.sensitivity == 3
    assert verdict.categories == ("password", "phone_number")
    assert text_categories("") == set()


def test_scanning_fails_closed_at_its_limits():
    detector = LocalSensitivityDetector(characters_max=10, depth_max=2)
    assert detector.detect("a" * 10).sensitivity == 0
    with pytest.raises(SensitivityCheckFailed):
        detector.detect("a" * 11)
    assert detector.detect([{"k": "deep"}]).sensitivity == 0
    with pytest.raises(SensitivityCheckFailed):
        detector.detect([[["deeper"]]])
    with pytest.raises(SensitivityCheckFailed):
        detect({"when": object()})
    with pytest.raises(SensitivityCheckFailed):
        detect({1: "non-text key"})
    with pytest.raises(SensitivityCheckFailed):
        FailingSensitivityDetector().detect({})
    assert sensitivity_scan_characters_max >= 1_000_000 and sensitivity_scan_depth_max >= 16


def test_the_default_limits_at_and_over_their_boundary():
    assert detect("a" * sensitivity_scan_characters_max).sensitivity == 0
    with pytest.raises(SensitivityCheckFailed):
        detect("a" * (sensitivity_scan_characters_max + 1))
    nested: object = "x"
    for _ in range(sensitivity_scan_depth_max):
        nested = [nested]
    assert detect(nested).sensitivity == 0
    with pytest.raises(SensitivityCheckFailed):
        detect([nested])


@pytest.mark.parametrize(("text", "category"), [
    ("wifi PASSWORD: hunterxx", "password"),
    ("passcode=abcdef", "password"),
    ("PWD 是 abcdef", "password"),
    ("口令：abcdef", "password"),
    ("私钥: abcdefghij", "secret_key"),
    ("令牌 = abcdefghij", "secret_key"),
    ("Access-Token is abcdefghijk", "secret_key"),
    ("auth token: abcdefghijk", "secret_key"),
    ("Secret Key: abcdefghijk", "secret_key"),
    ("PRIVATE_KEY: abcdefghijk", "secret_key"),
    ("ghp_" + "a" * 36, "secret_key"),
    ("xoxb-abcdefghijkl", "secret_key"),
    ("-----BEGIN PRIVATE KEY-----", "secret_key"),
])
def test_the_cue_prefilter_lets_every_rule_without_digits_through(text, category):
    """``text_categories`` skips a text without any rule's cue: every digit-free form of a rule
    must still be found (the number rules need digits, which are cues)."""
    assert category in text_categories(text)
