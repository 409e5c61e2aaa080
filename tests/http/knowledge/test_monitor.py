"""/monitor/config, /monitor/log, capture_event and the digest's counts over real HTTP, with
the real directory watcher (watchfiles/inotify) on a temporary directory."""

from __future__ import annotations

import datetime
import os

import trio

from troupe.actors.knowledge.monitor import monitor_file_bytes_max, monitor_log_limit_max

from ._knowledge_harness import assert_error, wait_until

all_off = {"directory": False, "clipboard": False, "behavior": False, "screenshot": False}


def config(directories, *, enabled=True, directory=True, **sources):
    return {"enabled": enabled, "sources": {**all_off, "directory": directory, **sources},
            "directories": directories}


async def log(client, **params):
    response = await client.get("/monitor/log", params=params)
    assert response.status_code == 200, response.text
    return response.json()["events"]


async def wait_for_status(client, status, count=1):
    async def found():
        events = [event for event in await log(client) if event["status"] == status]
        return events if len(events) >= count else None

    return await wait_until(found, seconds=15)


async def test_defaults_and_an_empty_log(client):
    response = await client.get("/monitor/config")
    assert response.status_code == 200
    body = response.json()
    assert {key: body[key] for key in ("enabled", "sources", "directories")} == {
        "enabled": False, "sources": all_off, "directories": []}
    assert body["source_status"]["clipboard"]["active"] is False
    assert "platform" in body["source_status"]["clipboard"]["reason"]
    assert await log(client) == []


async def test_invalid_configurations_change_nothing(client, tmp_path):
    good = config([str(tmp_path)])
    bad = [
        {**good, "sources": {**good["sources"], "keyboard": True}},   # unknown source
        {**good, "enabled": "yes"},                                   # wrong type
        {**good, "sources": {**good["sources"], "clipboard": 1}},     # wrong type
        {**good, "directories": ["relative/path"]},                   # relative path
        {**good, "directories": [""]},                                # empty path
        {**good, "directories": str(tmp_path)},                       # not a list
        {"enabled": True, "sources": good["sources"]},                # not a full replacement
        {**good, "extra": 1},                                         # unknown field
        {**good, "sources": {"directory": True}},                     # a source missing
        [good],
    ]
    for body in bad:
        assert_error(await client.put("/monitor/config", json=body), 400, "INVALID_REQUEST")
    too_many = config([f"/d{index}" for index in range(65)])
    assert_error(await client.put("/monitor/config", json=too_many), 400, "INVALID_REQUEST")
    assert (await client.put("/monitor/config", json=config([f"/d{index}" for index in range(64)]),
                             )).status_code == 200
    assert (await client.put("/monitor/config", json=config([], enabled=False))).status_code == 200
    assert (await client.get("/monitor/config")).json()["directories"] == []


async def test_put_normalises_persists_and_logs_state_changed(client, tmp_path):
    directory = str(tmp_path)
    body = config([directory + "/", directory, directory + "/./"], clipboard=True)
    response = await client.put("/monitor/config", json=body)
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["directories"] == [directory]
    assert document["sources"]["clipboard"] is True
    assert document["source_status"]["clipboard"]["active"] is False
    assert document["source_status"]["directory"]["active"] is True
    again = (await client.get("/monitor/config")).json()
    assert again["directories"] == [directory] and again["enabled"] is True
    [entry] = await log(client)
    assert entry["source"] == "system" and entry["status"] == "state_changed"
    assert directory not in entry["summary"]
    # echoing the GET body back (with the read-only status) is accepted
    assert (await client.put("/monitor/config", json=again)).status_code == 200


async def test_directory_capture_end_to_end(client, tmp_path):
    watched = tmp_path / "inbox"
    watched.mkdir()
    response = await client.put("/monitor/config", json=config([str(watched)]))
    assert response.status_code == 200
    await trio.sleep(0.3)

    (watched / "支出清单.txt").write_text("2026年4月家庭支出清单\n电费 210 元\n", encoding="utf-8")
    [ingested] = await wait_for_status(client, "ingested")
    assert ingested["source"] == "directory" and ingested["summary"] == "记住文件 支出清单.txt"
    evidence = (await client.get(f"/evidence/{ingested['evidence_id']}")).json()
    assert evidence["raw"]["content"].startswith("2026年4月家庭支出清单")
    assert evidence["scope"] == "user:local" and evidence["sensitivity"] == 0

    # the same content again (a touch) is not captured twice
    os.utime(watched / "支出清单.txt")
    (watched / "secret.txt").write_text("我的银行卡密码: hunter2hunter2\n", encoding="utf-8")
    [quarantined] = await wait_for_status(client, "sensitive_quarantined")
    assert "hunter2" not in quarantined["summary"] and "secret.txt" in quarantined["summary"]
    sensitive = (await client.get(f"/evidence/{quarantined['evidence_id']}")).json()
    assert sensitive["sensitivity"] > 0

    (watched / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (watched / "big.txt").write_bytes(b"a" * (monitor_file_bytes_max + 1))
    (watched / "limit.txt").write_bytes(b"b" * monitor_file_bytes_max)
    ignored = await wait_for_status(client, "ignored", 2)
    assert {event["summary"].split("（")[0] for event in ignored} >= {"忽略文件 blob.bin", "忽略文件 big.txt"}
    await wait_for_status(client, "ingested", 2)  # exactly at the limit is captured
    assert len([event for event in await log(client) if event["status"] == "ingested"]) == 2

    # a changed file is captured again
    (watched / "支出清单.txt").write_text("2026年5月家庭支出清单\n电费 190 元\n", encoding="utf-8")
    await wait_for_status(client, "ingested", 3)

    # the digest counts today's captures (ingested by source, quarantined apart)
    today = datetime.date.today().isoformat()
    digest = (await client.get("/delivery/digest", params={"date": today})).json()
    assert digest["summary"] == "当日新增 3 条记忆（目录 3），另有 1 条敏感内容已隔离"

    # paging: newest first, limit and offset bounds
    events = await log(client)
    assert [event["status"] for event in events][0] == "ingested"
    assert await log(client, limit=1) == events[:1]
    assert await log(client, limit=2, offset=1) == events[1:3]
    assert await log(client, offset=len(events)) == []
    assert len(await log(client, limit=monitor_log_limit_max)) == len(events)
    for params in ({"limit": 0}, {"limit": monitor_log_limit_max + 1}, {"limit": "x"}, {"offset": -1}):
        assert_error(await client.get("/monitor/log", params=params), 400, "INVALID_REQUEST")

    # removing the directory stops the watcher at once
    response = await client.put("/monitor/config", json=config([]))
    assert response.json()["source_status"]["directory"]["active"] is False
    count = len(await log(client))
    (watched / "later.txt").write_text("不应被记住\n", encoding="utf-8")
    await trio.sleep(1.0)
    assert len(await log(client)) == count
