"""The sensitivity detector: a local, deterministic check run on every write before anything
is stored or any idempotency receipt is taken.

Why local and rule-based: the contract wants the check to run before the receipt (a refused
write leaves no trace), to decide between storing and refusing (``shared:*`` never receives
sensitive content: 422 ``SENSITIVE_SHARED_SCOPE``), and to keep anything with
``sensitivity > 0`` out of every agent context.  A model call there would make every write
depend on a network and a non-deterministic answer; the rules below are pure functions of the
text, so a replayed write gets the same verdict and the simulator reproduces it.  The price is
recall: a secret written in a form the rules do not know passes.  The rules err towards
flagging (a false positive only keeps a user's own memory out of the agent context).

What is found, with the level it gives (the verdict's ``sensitivity`` is the highest level):
- 1 ``phone_number``: mainland mobile numbers (``1[3-9]`` + 9 digits, optional ``+86``) and
  ``+``-prefixed international numbers;
- 2 ``id_number``: 18-character resident identity numbers whose checksum and birth date hold;
- 2 ``bank_card``: 16 to 19 digits (spaces or dashes between groups allowed) passing Luhn;
- 3 ``password``: "password/密码/口令 is|是|:|= value", or a JSON key naming a password with a
  non-empty value;
- 3 ``secret_key``: private key blocks, well-known token shapes (``sk-``, ``AKIA``, ``ghp_``,
  ``xox?-``), "api key/secret/token/密钥 : value", or a JSON key naming one with a value.

It can fail, and then the write fails closed (503 ``SENSITIVITY_CHECK_FAILED``, no receipt, no
evidence): ``SensitivityCheckFailed`` is raised for a value it cannot read (a type JSON does not
have), one nested deeper than ``sensitivity_scan_depth_max`` or holding more than
``sensitivity_scan_characters_max`` characters of text: a verdict on a prefix would be a guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

sensitivity_none = 0
sensitivity_personal = 1
sensitivity_identity = 2
sensitivity_secret = 3
sensitivity_levels = (sensitivity_none, sensitivity_personal, sensitivity_identity,
                      sensitivity_secret)

sensitivity_scan_characters_max = 2_000_000
"""Text (keys and values together) one check reads; beyond it the check fails closed."""
sensitivity_scan_depth_max = 32
"""Objects and arrays nested in one another that one check walks; deeper values fail it."""

category_phone_number = "phone_number"
category_id_number = "id_number"
category_bank_card = "bank_card"
category_password = "password"
category_secret_key = "secret_key"
category_levels = {
    category_phone_number: sensitivity_personal,
    category_id_number: sensitivity_identity,
    category_bank_card: sensitivity_identity,
    category_password: sensitivity_secret,
    category_secret_key: sensitivity_secret,
}


class SensitivityCheckFailed(Exception):
    """The detector could not give a verdict; the write must fail closed (503
    ``SENSITIVITY_CHECK_FAILED``) without taking its idempotency receipt."""


@dataclass(frozen=True)
class SensitivityVerdict:
    """``sensitivity`` is 0 (nothing found) or the highest level found; ``categories`` the
    kinds found, sorted, for the evidence row (never the matched text itself)."""

    sensitivity: int
    categories: tuple[str, ...] = ()

    @property
    def is_sensitive(self) -> bool:
        return self.sensitivity > sensitivity_none


not_sensitive = SensitivityVerdict(sensitivity_none)


class SensitivityDetector(Protocol):
    """What the knowledge actors need: a verdict on a JSON-like value, or
    ``SensitivityCheckFailed``.  ``LocalSensitivityDetector`` is the default."""

    def detect(self, value: Any) -> SensitivityVerdict: ...


_separator = r"\s*(?:is|是|为|[:：=])\s*"
_phone_pattern = re.compile(
    r"(?<![0-9])(?:(?:\+|00)86[- ]?)?1[3-9][0-9](?:[- ]?[0-9]{4}){2}(?![0-9])"
    r"|(?<![0-9A-Za-z+])\+[1-9][0-9]{0,2}[- ]?[0-9](?:[- ]?[0-9]){6,13}(?![0-9])")
_id_number_pattern = re.compile(r"(?<![0-9A-Za-z])[1-9][0-9]{16}[0-9Xx](?![0-9A-Za-z])")
_card_pattern = re.compile(r"(?<![0-9])[0-9](?:[ -]?[0-9]){15,18}(?![0-9])")
_password_pattern = re.compile(
    r"(?i)(?:password|passwd|passcode|pwd|密码|口令)" + _separator + r"\S+")
_secret_phrase_pattern = re.compile(
    r"(?i)(?:api[ _-]?key|secret(?:[ _-]?key)?|access[ _-]?token|auth[ _-]?token|private[ _-]?key"
    r"|密钥|私钥|令牌)" + _separator + r"\S{8,}")
_secret_shape_pattern = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}"
    r"|(?<![A-Za-z0-9])AKIA[0-9A-Z]{16}(?![A-Za-z0-9])"
    r"|(?<![A-Za-z0-9])gh[pousr]_[A-Za-z0-9]{30,}"
    r"|(?<![A-Za-z0-9])xox[abprs]-[A-Za-z0-9-]{10,}")
_password_key_pattern = re.compile(r"(?i)^(?:password|passwd|passcode|pwd|密码|口令)$")
_secret_key_pattern = re.compile(
    r"(?i)^(?:api[ _-]?key|secret(?:[ _-]?key)?|access[ _-]?token|auth[ _-]?token"
    r"|private[ _-]?key|密钥|私钥)$")

_id_weights = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_id_check_characters = "10X98765432"


def _is_identity_number(text: str) -> bool:
    """The resident identity number's ISO 7064 checksum and a plausible birth date."""
    total = sum(int(digit) * weight for digit, weight in zip(text[:17], _id_weights, strict=True))
    if _id_check_characters[total % 11] != text[17].upper():
        return False
    year, month, day = int(text[6:10]), int(text[10:12]), int(text[12:14])
    return 1900 <= year <= 2100 and 1 <= month <= 12 and 1 <= day <= 31


def _passes_luhn(digits: str) -> bool:
    total = 0
    for position, character in enumerate(reversed(digits)):
        digit = int(character)
        if position % 2 == 1:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


_cue_pattern = re.compile(
    r"(?i)[0-9]|pass|pwd|密码|口令|api|secret|token|private|密钥|私钥|令牌|sk-|akia|gh[pousr]_|xox")
"""Something every rule above needs (a digit for the number rules, a keyword or token prefix for
the others): a text without any is clean after one scan instead of seven.  A superset of the
rules' cues, so it can only skip texts that no rule would flag (``test_sensitivity`` checks
each rule's examples through it)."""


def text_categories(text: str) -> set[str]:
    """The categories found in one piece of text."""
    found: set[str] = set()
    if not _cue_pattern.search(text):
        return found
    if _phone_pattern.search(text):
        found.add(category_phone_number)
    if any(_is_identity_number(match.group()) for match in _id_number_pattern.finditer(text)):
        found.add(category_id_number)
    for match in _card_pattern.finditer(text):
        digits = re.sub(r"[ -]", "", match.group())
        if _passes_luhn(digits) and not _is_identity_number_text(digits):
            found.add(category_bank_card)
            break
    if _password_pattern.search(text):
        found.add(category_password)
    if _secret_phrase_pattern.search(text) or _secret_shape_pattern.search(text):
        found.add(category_secret_key)
    return found


def _is_identity_number_text(digits: str) -> bool:
    return len(digits) == 18 and _is_identity_number(digits)


class LocalSensitivityDetector:
    """The default detector (see the module docstring for its rules and failures)."""

    def __init__(self, *, characters_max: int = sensitivity_scan_characters_max,
                 depth_max: int = sensitivity_scan_depth_max) -> None:
        self._characters_max = characters_max
        self._depth_max = depth_max

    def detect(self, value: Any) -> SensitivityVerdict:
        texts: list[str] = []
        found: set[str] = set()
        self._walk(value, 0, texts, found, [0])
        for text in texts:
            found |= text_categories(text)
        if not found:
            return not_sensitive
        return SensitivityVerdict(sensitivity=max(category_levels[name] for name in found),
                                  categories=tuple(sorted(found)))

    def _walk(self, value: Any, depth: int, texts: list[str], found: set[str],
              characters: list[int]) -> None:
        if isinstance(value, (Mapping, list, tuple)) and depth >= self._depth_max:
            raise SensitivityCheckFailed(
                f"more than {self._depth_max} objects or arrays nested in one another")
        if value is None or isinstance(value, bool):
            return
        if isinstance(value, (int, float)):
            self._add_text(str(value), texts, characters)
        elif isinstance(value, str):
            self._add_text(value, texts, characters)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise SensitivityCheckFailed("object key is not text")
                self._add_text(key, texts, characters)
                self._check_named_field(key, item, found)
                if isinstance(item, (str, int, float)) and not isinstance(item, bool):
                    # "key: value" lets the phrase rules see a field named like a secret.
                    # Not counted against the limit: it repeats characters already counted.
                    texts.append(f"{key}: {item}")
                self._walk(item, depth + 1, texts, found, characters)
        elif isinstance(value, (list, tuple)):
            for item in value:
                self._walk(item, depth + 1, texts, found, characters)
        else:
            raise SensitivityCheckFailed(f"cannot read a {type(value).__name__}")

    def _add_text(self, text: str, texts: list[str], characters: list[int]) -> None:
        characters[0] += len(text)
        if characters[0] > self._characters_max:
            raise SensitivityCheckFailed(
                f"more than {self._characters_max} characters to check")
        texts.append(text)

    @staticmethod
    def _check_named_field(key: str, item: Any, found: set[str]) -> None:
        if item is None or item == "" or isinstance(item, (bool, Mapping, list, tuple)):
            return
        if _password_key_pattern.match(key.strip()):
            found.add(category_password)
        elif _secret_key_pattern.match(key.strip()):
            found.add(category_secret_key)


class FailingSensitivityDetector:
    """A detector that always fails: for tests of the 503 path and for the simulator."""

    def detect(self, value: Any) -> SensitivityVerdict:
        raise SensitivityCheckFailed("the sensitivity detector is unavailable")


local_sensitivity_detector = LocalSensitivityDetector()

__all__ = [
    "FailingSensitivityDetector",
    "LocalSensitivityDetector",
    "SensitivityCheckFailed",
    "SensitivityDetector",
    "SensitivityVerdict",
    "category_bank_card",
    "category_id_number",
    "category_levels",
    "category_password",
    "category_phone_number",
    "category_secret_key",
    "local_sensitivity_detector",
    "not_sensitive",
    "sensitivity_identity",
    "sensitivity_levels",
    "sensitivity_none",
    "sensitivity_personal",
    "sensitivity_scan_characters_max",
    "sensitivity_scan_depth_max",
    "sensitivity_secret",
    "text_categories",
]
