"""Profiles, client tool validation at and over every limit, and application prompts."""

from __future__ import annotations

import pytest

from troupe.actors.sessions._profiles import (
    ToolTable,
    client_tools_max,
    resolve_tool_table,
)
from troupe.actors.sessions._prompts import compose_system_prompt
from troupe.actors.sessions._protocol import ClientToolDeclaration, SessionRefused
from troupe.actors.sessions._tools import builtin_tool_names
from troupe.models._local_agent import parse_script


def tool(name="echo", description="d", timeout_ms=120_000, **options) -> ClientToolDeclaration:
    return ClientToolDeclaration(name=name, description=description, timeout_ms=timeout_ms, **options)


def refused(result) -> str:
    assert isinstance(result, SessionRefused), result
    return result.code


def test_mobile_default_is_the_upper_bound():
    table = resolve_tool_table()
    assert isinstance(table, ToolTable) and table.builtin == builtin_tool_names
    assert resolve_tool_table(profile_name="mobile-default") == table


def test_tools_only_narrow():
    table = resolve_tool_table(tools=["Http", "TodoWrite"])
    assert table.builtin == ("TodoWrite", "Http")  # profile order
    assert resolve_tool_table(tools=[]).builtin == ()
    assert resolve_tool_table(tools=["Http"], app_capabilities=["TodoWrite"]).builtin == ()


def test_unknown_names_fail_the_create():
    assert refused(resolve_tool_table(tools=["Bash"])) == "create_failed"
    result = resolve_tool_table(profile_name="desktop-max")
    assert refused(result) == "create_failed" and result.status == 400


def test_client_tool_count_limit():
    tools = [tool(f"t{index}") for index in range(client_tools_max)]
    assert len(resolve_tool_table(client_tools=tools).client) == client_tools_max
    assert refused(resolve_tool_table(client_tools=tools + [tool("extra")])) == "validation_failed"


@pytest.mark.parametrize(
    ("declaration", "ok"),
    [
        (tool("a" * 64), True),
        (tool("a" * 65), False),
        (tool("A_1"), True),
        (tool("1abc"), False),
        (tool("_abc"), False),
        (tool("a-b"), False),
        (tool(description="x" * 2048), True),
        (tool(description="x" * 2049), False),
        (tool(description=""), False),
        (tool(timeout_ms=1000), True),
        (tool(timeout_ms=999), False),
        (tool(timeout_ms=600_000), True),
        (tool(timeout_ms=600_001), False),
        (tool(parameters={"type": "object"}), True),
        (tool(parameters=[1]), False),  # type: ignore[arg-type]
    ],
)
def test_client_tool_shape(declaration, ok):
    result = resolve_tool_table(client_tools=[declaration])
    if ok:
        assert isinstance(result, ToolTable)
    else:
        assert refused(result) == "validation_failed" and result.status == 400


def test_client_tool_clash_and_duplicates():
    assert refused(resolve_tool_table(client_tools=[tool("WebFetch")])) == "validation_failed"
    # A clash counts against every built-in, even one the allow-list removed.
    assert refused(resolve_tool_table(tools=[], client_tools=[tool("Http")])) == "validation_failed"
    assert refused(resolve_tool_table(client_tools=[tool("x"), tool("x")])) == "validation_failed"


def test_table_specs_and_lookup():
    table = resolve_tool_table(tools=["TodoWrite"], client_tools=[tool("echo", parameters=None)])
    specs = table.specs()
    assert [spec.name for spec in specs] == ["TodoWrite", "echo"]
    assert specs[1].parameters == {"type": "object", "properties": {}}
    assert table.client_tool("echo").timeout_ms == 120_000 and table.client_tool("nope") is None
    assert table.summary() == {"builtin": ["TodoWrite"], "client": ["echo"]}


# -- application prompts -----------------------------------------------------------------


def test_platform_default_when_nothing_is_configured():
    text, summary = compose_system_prompt("默认角色", None, None)
    assert text == "默认角色"
    assert summary == {"source": "default", "strategy": "fallback", "platformSegment": "default",
                       "sdkSegments": None, "appendSegments": 0}


def test_fallback_lets_explicit_sdk_segments_replace_the_platform_segment():
    text, summary = compose_system_prompt("默认", "平台", None, "fallback", ["业务一", "业务二"])
    assert text == "业务一\n\n业务二"
    assert summary["source"] == "sdk" and summary["platformSegment"] == "replaced"
    empty, summary = compose_system_prompt("默认", "平台", "补充", "fallback", [])
    assert empty == "补充" and summary["sdkSegments"] == 0


def test_prepend_keeps_the_platform_segment_first_even_with_empty_sdk_segments():
    text, summary = compose_system_prompt("默认", "平台", ["补充"], "prepend", ["业务"])
    assert text == "平台\n\n业务\n\n补充"
    assert (summary["source"], summary["platformSegment"]) == ("platform", "platform")
    text, _ = compose_system_prompt("默认", None, None, "prepend", [])
    assert text == "默认"


def test_summary_never_carries_text():
    _, summary = compose_system_prompt("secret default", "secret platform", "secret append",
                                       "prepend", ["secret sdk"])
    assert "secret" not in repr(summary)


# -- the local agent's directive parser --------------------------------------------------


def test_parse_script():
    script = parse_script('hello\n/tool Http {"url": "u"}\n/ask ["q"]\n/say a\n/say b\n/slow 2\n/fail unavailable x')
    assert [step.calls[0].name for step in script.steps[:2]] == ["Http", "AskUser"]
    assert script.steps[1].calls[0].arguments == {"questions": ["q"]}
    assert script.steps[2].fail == ("unavailable", "x")
    assert (script.say, script.slow_seconds) == ("a\nb", 2.0)
    assert parse_script("no directives here") is None
    assert parse_script("/tool Http [1]").errors
