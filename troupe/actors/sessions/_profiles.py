"""Capabilities profiles and the session's tool table.

A session's tools are decided once, when it is assembled (create, or reassembly from the store
on resume), and never change while it is live: the contract says capability changes reach only
new and reassembled sessions.  The table is the intersection of three things:

- the profile (``capabilitiesProfile``, a server-held name; ``mobile-default`` is built in and
  is the upper bound of what a mobile app may tick: TodoWrite, AskUser, WebFetch, Http,
  WebSearch and the four media tools);
- the deployment's application capabilities (``app_capabilities``, optional): what the
  operator switched on;
- the create request's ``tools`` allow-list, which can only narrow: a name that is not a
  built-in tool at all is ``create_failed`` (an unknown alias; retrying does not help), a
  built-in outside the profile is simply not granted.

Client tools (``clientTools``) are a separate path: the HTTP layer checks each declaration's
shape (name pattern, description 1–2048, ``timeoutMs`` 1000–600000); this module checks what
needs the whole list and the built-ins: at most ``client_tools_max`` (32), unique names, no
clash with a built-in name (400 ``validation_failed``).  ``validate_client_tool`` repeats the
shape rules, so a caller without pydantic (the simulator, a fork from stored options) gets the
same answers.  Errors are ``SessionRefused`` values, never exceptions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from troupe.models import ToolSpec

from ._protocol import ClientToolDeclaration, SessionRefused
from ._tools import builtin_tool_names, builtin_tools

mobile_default_profile_name = "mobile-default"

client_tools_max = 32
client_tool_name_pattern = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
client_tool_description_chars_min = 1
client_tool_description_chars_max = 2048
client_tool_timeout_milliseconds_min = 1_000
client_tool_timeout_milliseconds_max = 600_000
client_tool_timeout_milliseconds_default = 120_000

assert (
    client_tool_timeout_milliseconds_min
    <= client_tool_timeout_milliseconds_default
    <= client_tool_timeout_milliseconds_max
)


@dataclass(frozen=True)
class Profile:
    name: str
    tools: tuple[str, ...]


profiles: Mapping[str, Profile] = {
    mobile_default_profile_name: Profile(mobile_default_profile_name, builtin_tool_names),
}
"""The server-held profiles by name."""


@dataclass(frozen=True)
class ToolTable:
    """The tools of one session: built-in names (in profile order) and client declarations."""

    builtin: tuple[str, ...] = ()
    client: tuple[ClientToolDeclaration, ...] = ()

    def names(self) -> tuple[str, ...]:
        return self.builtin + tuple(tool.name for tool in self.client)

    def client_tool(self, name: str) -> ClientToolDeclaration | None:
        return next((tool for tool in self.client if tool.name == name), None)

    def specs(self) -> tuple[ToolSpec, ...]:
        """The tool specs the model sees."""
        specs = [builtin_tools[name].spec() for name in self.builtin]
        for tool in self.client:
            parameters = tool.parameters or {"type": "object", "properties": {}}
            specs.append(ToolSpec(tool.name, tool.description, parameters))
        return tuple(specs)

    def summary(self) -> dict[str, Any]:
        return {"builtin": list(self.builtin), "client": [tool.name for tool in self.client]}


def resolve_tool_table(
    *,
    profile_name: str | None = None,
    tools: Sequence[str] | None = None,
    client_tools: Sequence[ClientToolDeclaration] = (),
    app_capabilities: Iterable[str] | None = None,
) -> ToolTable | SessionRefused:
    """The session's tool table, or the refusal the create request gets."""
    profile = profiles.get(profile_name or mobile_default_profile_name)
    if profile is None:
        return SessionRefused(
            "create_failed",
            f"未知的能力档：{profile_name}",
            {"capabilitiesProfile": profile_name},
        )
    granted = list(profile.tools)
    if app_capabilities is not None:
        allowed = set(app_capabilities)
        granted = [name for name in granted if name in allowed]
    if tools is not None:
        unknown = [name for name in tools if name not in builtin_tools]
        if unknown:
            return SessionRefused(
                "create_failed", f"未知的工具：{', '.join(unknown)}", {"tools": unknown}
            )
        wanted = set(tools)
        granted = [name for name in granted if name in wanted]
    refusal = check_client_tools(client_tools)
    if refusal is not None:
        return refusal
    return ToolTable(tuple(granted), tuple(client_tools))


def check_client_tools(client_tools: Sequence[ClientToolDeclaration]) -> SessionRefused | None:
    """Count, uniqueness, clash with built-ins and each declaration's shape."""
    if len(client_tools) > client_tools_max:
        return _invalid(f"clientTools 最多 {client_tools_max} 个", "clientTools")
    seen: set[str] = set()
    for index, tool in enumerate(client_tools):
        refusal = validate_client_tool(tool, index)
        if refusal is not None:
            return refusal
        if tool.name in builtin_tools:
            return _invalid(f"clientTools 与内置工具撞名：{tool.name}", f"clientTools[{index}].name")
        if tool.name in seen:
            return _invalid(f"clientTools 名称重复：{tool.name}", f"clientTools[{index}].name")
        seen.add(tool.name)
    return None


def validate_client_tool(tool: ClientToolDeclaration, index: int = 0) -> SessionRefused | None:
    """The contract's shape rules for one declaration."""
    where = f"clientTools[{index}]"
    if not isinstance(tool.name, str) or not client_tool_name_pattern.match(tool.name):
        return _invalid("工具名须匹配 ^[A-Za-z][A-Za-z0-9_]{0,63}$", f"{where}.name")
    if not (
        isinstance(tool.description, str)
        and client_tool_description_chars_min
        <= len(tool.description)
        <= client_tool_description_chars_max
    ):
        return _invalid("description 长度须在 1–2048 之间", f"{where}.description")
    timeout = tool.timeout_ms
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int)
        or not client_tool_timeout_milliseconds_min <= timeout <= client_tool_timeout_milliseconds_max
    ):
        return _invalid("timeoutMs 须在 1000–600000 之间", f"{where}.timeoutMs")
    if tool.parameters is not None and not isinstance(tool.parameters, Mapping):
        return _invalid("parameters 须是对象", f"{where}.parameters")
    return None


def _invalid(message: str, field: str) -> SessionRefused:
    return SessionRefused("validation_failed", message, {"field": field})


__all__ = [
    "Profile",
    "ToolTable",
    "check_client_tools",
    "client_tool_description_chars_max",
    "client_tool_description_chars_min",
    "client_tool_name_pattern",
    "client_tool_timeout_milliseconds_default",
    "client_tool_timeout_milliseconds_max",
    "client_tool_timeout_milliseconds_min",
    "client_tools_max",
    "mobile_default_profile_name",
    "profiles",
    "resolve_tool_table",
    "validate_client_tool",
]
