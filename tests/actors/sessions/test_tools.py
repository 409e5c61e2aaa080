"""Built-in tools: private-target refusal, bounded fetches, not-configured providers, limits."""

from __future__ import annotations

import httpx
import pytest
import trio

from troupe.actors.sessions._tools import (
    TargetRefused,
    ToolContext,
    ToolResult,
    ToolSettings,
    address_is_public,
    builtin_tool_names,
    builtin_tools,
    check_target,
    fetch_redirects_max,
    questions_max,
    todos_max,
)
from troupe.sim._sim_env import sim_env

from .kernel_helpers import RecordingPorts


@pytest.fixture
def env(tmp_path):
    return sim_env(1, str(tmp_path))


def resolver(table: dict[str, list[str]]):
    async def resolve(host: str) -> list[str]:
        if host not in table:
            raise OSError("no such host")
        return table[host]

    return resolve


names = {
    "public.test": ["93.184.216.34"],
    "mixed.test": ["93.184.216.34", "10.0.0.5"],
    "loop.test": ["127.0.0.1"],
    "v6local.test": ["fe80::1%eth0"],
    "empty.test": [],
}


def context(env, settings: ToolSettings) -> tuple[ToolContext, RecordingPorts]:
    ports = RecordingPorts(env)
    return ToolContext(env, "s_1", "t_1", "call_1", ports.publish, ports.bridges, settings), ports


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata, link-local
        ("100.64.0.1", False),  # shared address space
        ("0.0.0.0", False),
        ("::1", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("224.0.0.1", False),
        ("not-an-address", False),
    ],
)
def test_address_is_public(address, public):
    assert address_is_public(address) is public


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("http://127.0.0.1/", "private_target"),
        ("http://[::1]:8080/", "private_target"),
        ("http://169.254.169.254/latest/meta-data", "private_target"),
        ("https://loop.test/", "private_target"),
        ("https://mixed.test/", "private_target"),  # every address must be public
        ("https://v6local.test/", "private_target"),
        ("https://empty.test/", "unresolvable"),
        ("https://nowhere.test/", "unresolvable"),
        ("ftp://public.test/", "invalid_url"),
        ("file:///etc/passwd", "invalid_url"),
        ("https://user:pw@public.test/", "invalid_url"),
    ],
)
async def test_check_target_refuses(url, code):
    with pytest.raises(TargetRefused) as refused:
        await check_target(url, ToolSettings(resolver=resolver(names)))
    assert refused.value.code == code


async def test_check_target_allows_public_and_the_operator_override():
    await check_target("https://public.test/x", ToolSettings(resolver=resolver(names)))
    await check_target("http://127.0.0.1/", ToolSettings(allow_private_targets=True))


async def test_webfetch_reads_bounded_text(env):
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="a" * 5000, headers={"content-type": "text/plain"})

    env.extras["network"].route("public.test", handler)
    tool_context, ports = context(env, ToolSettings(resolver=resolver(names), response_bytes_max=4096))
    result = await builtin_tools["WebFetch"].run({"url": "https://public.test/page"}, tool_context)
    assert not result.is_error
    assert result.output["status"] == 200 and result.output["truncated"] is True
    assert len(result.output["body"]) == 4096
    assert ports.types() == ["tool.progress"]


async def test_redirect_to_a_private_target_is_refused(env):
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"location": "http://169.254.169.254/"})

    env.extras["network"].route("public.test", handler)
    tool_context, _ = context(env, ToolSettings(resolver=resolver(names)))
    result = await builtin_tools["WebFetch"].run({"url": "https://public.test/"}, tool_context)
    assert result.is_error and result.code == "private_target"


async def test_redirect_loops_are_bounded(env):
    hops = []

    async def handler(request: httpx.Request) -> httpx.Response:
        hops.append(str(request.url))
        return httpx.Response(302, headers={"location": "/again"})

    env.extras["network"].route("public.test", handler)
    tool_context, _ = context(env, ToolSettings(resolver=resolver(names)))
    result = await builtin_tools["Http"].run({"url": "https://public.test/"}, tool_context)
    assert result.code == "too_many_redirects" and len(hops) == fetch_redirects_max + 1


async def test_fetch_time_is_bounded(env, autojump_clock):
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep(1000)
        return httpx.Response(200)

    env.extras["network"].route("public.test", handler)
    tool_context, _ = context(env, ToolSettings(resolver=resolver(names), timeout_seconds=5))
    started = trio.current_time()
    result = await builtin_tools["WebFetch"].run({"url": "https://public.test/"}, tool_context)
    assert result.code == "timeout" and trio.current_time() - started == pytest.approx(5)


async def test_http_sends_no_host_credentials_and_drops_transport_headers(env):
    seen = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.update(request.headers)
        seen["body"] = request.content
        return httpx.Response(404, json={"missing": True})

    env.extras["network"].route("public.test", handler)
    tool_context, _ = context(env, ToolSettings(resolver=resolver(names)))
    result = await builtin_tools["Http"].run(
        {"method": "PUT", "url": "https://public.test/a", "body": "x",
         "headers": {"X-App": "1", "Proxy-Authorization": "steal", "Host": "evil"}},
        tool_context,
    )
    assert result.is_error and result.code == "http_404" and result.output["status"] == 404
    assert seen["x-app"] == "1" and "proxy-authorization" not in seen
    assert seen["host"] == "public.test" and seen["body"] == b"x"
    assert "authorization" not in seen


@pytest.mark.parametrize("name", ["WebSearch", "ImageGen", "VideoGen", "TextToSpeech", "SpeechToText"])
async def test_provider_tools_are_not_configured_by_default(env, name):
    tool_context, _ = context(env, ToolSettings())
    result = await builtin_tools[name].run({}, tool_context)
    assert result.is_error and result.code == "tool_not_configured"
    assert result.output["error"]["tool"] == name


async def test_provider_tool_uses_the_configured_provider(env):
    async def search(arguments, tool_context):
        return ToolResult({"results": [arguments["query"]]})

    tool_context, _ = context(env, ToolSettings(providers={"WebSearch": search}))
    result = await builtin_tools["WebSearch"].run({"query": "trio"}, tool_context)
    assert result.output == {"results": ["trio"]}


def test_builtin_names_follow_the_profile():
    assert builtin_tool_names == (
        "TodoWrite", "AskUser", "WebFetch", "Http", "WebSearch",
        "ImageGen", "VideoGen", "TextToSpeech", "SpeechToText",
    )
    assert [name for name in builtin_tool_names if builtin_tools[name].needs_permission] == [
        "WebFetch", "Http"
    ]


async def test_todo_limit(env):
    tool_context, ports = context(env, ToolSettings())
    todos = [{"content": f"t{index}", "status": "pending"} for index in range(todos_max)]
    assert not (await builtin_tools["TodoWrite"].run({"todos": todos}, tool_context)).is_error
    over = await builtin_tools["TodoWrite"].run({"todos": todos + [todos[0]]}, tool_context)
    assert over.code == "invalid_arguments"
    bad = await builtin_tools["TodoWrite"].run({"todos": [{"content": "x", "status": "done"}]}, tool_context)
    assert bad.code == "invalid_arguments"
    assert len(ports.payloads("plan.todo.updated")) == 1


async def test_ask_user_limit(env, autojump_clock):
    tool_context, ports = context(env, ToolSettings())
    ports.subscribed = False
    questions = [{"question": f"q{index}"} for index in range(questions_max)]
    over = await builtin_tools["AskUser"].run({"questions": questions + [{"question": "x"}]}, tool_context)
    assert over.code == "invalid_arguments"
    degraded = await builtin_tools["AskUser"].run({"questions": questions}, tool_context)
    assert degraded.output["answered"] is False
    asked = ports.payloads("server.question.request")[0]["questions"]
    assert [question["id"] for question in asked] == [f"q{index + 1}" for index in range(questions_max)]


async def test_names_resolve_through_the_env_resolver_when_the_settings_name_none(tmp_path):
    # The simulator's network resolves names itself (a real lookup would be I/O outside the
    # seed): a routed name gets a public address, an unknown one does not resolve.
    env = sim_env(1, str(tmp_path))

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="ok")

    env.extras["network"].route("docs.sim.test", handler)
    await check_target("https://docs.sim.test/page", ToolSettings(), env=env)
    with pytest.raises(TargetRefused) as refused:
        await check_target("https://nowhere.sim.test/page", ToolSettings(), env=env)
    assert refused.value.code == "unresolvable"
