"""Monitor catch-up over real HTTP with the real watcher: files written or changed while the
server was stopped are captured after the restart exactly once (and what was seen before is
not captured again); a directory configured before it exists is picked up when it appears;
captured files are ``MANUAL_CONFIG`` evidence whose log and ``context.source`` say
``directory``."""

from __future__ import annotations

import trio

from troupe.actors.knowledge.monitor import catch_up_files_max, missing_retry_seconds_max

from ._knowledge_harness import start_knowledge_server, wait_until
from .test_monitor import config, log, wait_for_status


async def run_server(data_dir: str, body):
    """Start a server on ``data_dir``, run ``body(client)``, stop it."""
    async with trio.open_nursery() as nursery:
        server = await start_knowledge_server(nursery, data_dir)
        async with server.client() as client:
            result = await body(client)
        nursery.cancel_scope.cancel()
    return result


async def test_files_written_while_stopped_are_captured_once_after_restart(tmp_path):
    data_dir, watched = str(tmp_path / "data"), tmp_path / "inbox"
    watched.mkdir()
    (watched / "before.txt").write_text("配置之前就有的文件\n", encoding="utf-8")
    (watched / "changed.txt").write_text("第一版\n", encoding="utf-8")

    async def configure(client):
        assert (await client.put("/monitor/config", json=config([str(watched)]))).status_code == 200
        # the files present when the watch started are caught up at once
        return await wait_for_status(client, "ingested", 2)

    first = await run_server(data_dir, configure)
    assert {event["summary"] for event in first} == {"记住文件 before.txt", "记住文件 changed.txt"}

    # while the server is down: one new file, one changed, one binary, one untouched
    (watched / "offline.txt").write_text("服务器停机时写入的笔记\n", encoding="utf-8")
    (watched / "changed.txt").write_text("第二版，停机时改的\n", encoding="utf-8")
    (watched / "sub").mkdir()
    (watched / "sub" / "deep.md").write_text("子目录里的笔记\n", encoding="utf-8")
    (watched / "blob.bin").write_bytes(b"\x00binary")
    (watched / ".hidden.txt").write_text("隐藏文件\n", encoding="utf-8")

    async def after_restart(client):
        await wait_for_status(client, "ingested", 5)
        await wait_for_status(client, "ignored", 1)
        await trio.sleep(1.0)  # nothing else arrives later
        return await log(client)

    second = await run_server(data_dir, after_restart)
    ingested = sorted(event["summary"] for event in second if event["status"] == "ingested")
    assert ingested == ["记住文件 before.txt", "记住文件 changed.txt", "记住文件 changed.txt",
                        "记住文件 deep.md", "记住文件 offline.txt"]
    assert [event["summary"] for event in second if event["status"] == "ignored"] == ["忽略文件 blob.bin（不是文本）"]

    # a third start with nothing changed captures nothing and logs nothing new
    async def quiet(client):
        await trio.sleep(1.5)
        return await log(client)

    assert await run_server(data_dir, quiet) == second


async def test_captured_evidence_is_manual_config_from_directory(client, tmp_path):
    watched = tmp_path / "notes"
    watched.mkdir()
    (watched / "账单.txt").write_text("四月电费 210 元\n", encoding="utf-8")
    assert (await client.put("/monitor/config", json=config([str(watched)]))).status_code == 200
    [event] = await wait_for_status(client, "ingested")
    assert event["source"] == "directory"
    evidence = (await client.get(f"/evidence/{event['evidence_id']}")).json()
    assert evidence["source_type"] == "MANUAL_CONFIG"


async def test_a_directory_created_after_configuration_is_picked_up(client, tmp_path):
    later = tmp_path / "later"
    response = await client.put("/monitor/config", json=config([str(later)]))
    assert response.status_code == 200

    async def reported_missing():
        status = (await client.get("/monitor/config")).json()["source_status"]["directory"]
        return status["reason"] and "not found" in status["reason"]

    await wait_until(reported_missing, seconds=5)
    later.mkdir()
    (later / "first.txt").write_text("目录出现之前写不进来，出现后马上写\n", encoding="utf-8")
    [event] = await wait_for_status(client, "ingested")
    assert event["summary"] == "记住文件 first.txt"

    async def watching():
        status = (await client.get("/monitor/config")).json()["source_status"]["directory"]
        return status["active"] and status["reason"] is None

    await wait_until(watching, seconds=5)
    (later / "second.txt").write_text("之后的改动由监视器实时捕获\n", encoding="utf-8")
    await wait_for_status(client, "ingested", 2)


def test_catch_up_limits_are_named():
    assert catch_up_files_max == 10_000 and missing_retry_seconds_max == 60.0
