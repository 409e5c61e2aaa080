"""POST /api/v1/media over real HTTP: every allow-listed type's file header, mismatches and
unsupported types, strict Base64, the decoded and transfer limits at and just over their
boundary, understanding text, shared files with distinct object ids, the authorisation record,
scope rules for upload and reference, 404s, and the grace-period clean-up on the test clock."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
import trio

from troupe.actors.host import (
    SweepMedia,
    media_bytes_max,
    media_grace_seconds,
    media_header_matches,
    media_kind_name,
    media_store_key,
    media_sweep_interval_seconds,
)
from troupe.auth import TokenScope
from troupe.http.host import media_body_bytes_max

from ._host_harness import message, raw_upload, start_host_server
from .test_checks import assert_error

media_path = "/api/v1/media"
entry = "astrbot:group-a"

samples = {
    "image/png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    "image/jpeg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00",
    "image/gif": b"GIF89a\x01\x00\x01\x00",
    "image/webp": b"RIFF\x24\x00\x00\x00WEBPVP8 ",
    "audio/mpeg": b"ID3\x04\x00\x00\x00\x00\x00\x00",
    "audio/wav": b"RIFF\x24\x00\x00\x00WAVEfmt ",
    "audio/ogg": b"OggS\x00\x02\x00\x00",
    "audio/flac": b"fLaC\x00\x00\x00\x22",
    "video/mp4": b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00",
    "video/webm": b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\xf7\x81\x01\x42\x82\x84webm\x42\x87\x81\x04",
}
kinds = {"image": ["image/png", "image/jpeg", "image/gif", "image/webp"],
         "audio": ["audio/mpeg", "audio/wav", "audio/ogg", "audio/flac"],
         "video": ["video/mp4", "video/webm"]}


@pytest.fixture
async def host(nursery, tmp_path):
    return await start_host_server(nursery, str(tmp_path / "data"))


def upload(content_type: str = "image/png", data: bytes | None = None, **fields) -> dict:
    data = samples[content_type] if data is None else data
    return {"entry_id": entry, "content_type": content_type,
            "data_base64": base64.b64encode(data).decode("ascii"), **fields}


def fields_of(response) -> list[str]:
    return [problem["field"] for problem in response.json()["error"]["fields"]]


async def counts(host) -> tuple[int, int, int]:
    rows = await host.rows("SELECT (SELECT count(*) FROM host_media), (SELECT count(*) FROM blobs), "
                           "(SELECT count(*) FROM admin_operations)")
    return rows[0]


def test_every_allowed_type_has_its_header_and_no_other():
    for content_type, data in samples.items():
        assert media_header_matches(content_type, data), content_type
        others = [other for other in samples if other != content_type and media_header_matches(other, data)]
        assert others == [], content_type
    assert media_header_matches("audio/mpeg", b"\xff\xfb\x90\x64")  # an MP3 frame without ID3
    assert not media_header_matches("audio/mpeg", b"\xff\xf1\x50\x80")  # ADTS AAC is not audio/mpeg
    assert not media_header_matches("video/webm", b"\x1a\x45\xdf\xa3\x42\x82\x88matroska")
    assert not media_header_matches("image/svg+xml", b"<svg/>")


async def test_each_type_is_stored_with_its_kind_and_the_full_response(client, host):
    for kind, content_types in kinds.items():
        for content_type in content_types:
            response = await client.post(media_path, json=upload(content_type))
            assert response.status_code == 201, response.text
            assert response.headers["cache-control"] == "no-store"
            body = response.json()
            assert body == {
                "id": body["id"], "sha256": hashlib.sha256(samples[content_type]).hexdigest(),
                "content_type": content_type, "size_bytes": len(samples[content_type]), "kind": kind,
                "understanding_source": None, "understanding_text": None, "completed_at": None,
                "last_error": None,
            }
            assert body["id"].startswith("media_") and len(body["id"]) <= 100
    assert await counts(host) == (10, 10, 10)


async def test_mismatched_headers_and_unsupported_types_are_400_and_store_nothing(client, host):
    mismatch = await client.post(media_path, json=upload("image/png", samples["image/jpeg"]))
    assert_error(mismatch, 400, "invalid_request")
    assert fields_of(mismatch) == ["body.data_base64"]
    assert "image/jpeg" in mismatch.json()["error"]["fields"][0]["message"]
    for content_type in ("audio/wav", "video/mp4", "image/webp"):
        response = await client.post(media_path, json=upload(content_type, b"not a media file at all"))
        assert fields_of(response) == ["body.data_base64"]
    empty = await client.post(media_path, json=upload("image/gif", b""))
    assert fields_of(empty) == ["body.data_base64"]
    for content_type in ("image/svg+xml", "text/html", "application/pdf", "application/octet-stream", "image/jpg"):
        response = await client.post(media_path, json=upload("image/png") | {"content_type": content_type})
        assert_error(response, 400, "invalid_request")
        assert fields_of(response) == ["body.content_type"]
    assert await counts(host) == (0, 0, 0)


async def test_base64_must_be_standard_padded_without_prefix_or_newlines(client, host):
    good = base64.b64encode(samples["image/png"] + b"x").decode()
    assert good.endswith("=")
    bad_values = [
        "data:image/png;base64," + good,
        good[:8] + "\n" + good[8:],
        good + "\n",
        good.rstrip("="),  # no padding
        good + "==",  # extra padding
        base64.urlsafe_b64encode(b"\x89PNG\r\n\x1a\n\xfb\xff\xfe").decode(),  # URL-safe letters
        good[:-2] + "z=",  # non-canonical trailing bits
        "５" + good[1:],  # not ASCII
    ]
    for value in bad_values:
        response = await client.post(media_path, json=upload() | {"data_base64": value})
        assert_error(response, 400, "invalid_request")
        assert fields_of(response) == ["body.data_base64"], value
    assert (await client.post(media_path, json=upload() | {"data_base64": good})).status_code == 201


async def test_required_fields_types_and_entry_id_rules(client, host):
    response = await client.post(media_path, json={})
    assert_error(response, 400, "invalid_request")
    assert sorted(fields_of(response)) == ["body.content_type", "body.data_base64", "body.entry_id"]
    typed = await client.post(media_path, json=upload() | {"understanding_text": 5, "content_type": 3})
    assert sorted(fields_of(typed)) == ["body.content_type", "body.understanding_text"]
    for bad_entry in ("", "   ", "a?b", "a#b", "a\tb", "x" * 201):
        assert fields_of(await client.post(media_path, json=upload() | {"entry_id": bad_entry})) == ["body.entry_id"]
    assert fields_of(await client.post(media_path, json=[upload()])) == ["body"]
    multipart = await client.post(media_path, files={"file": ("a.png", samples["image/png"], "image/png")})
    assert fields_of(multipart) == ["header.content-type"]
    assert await counts(host) == (0, 0, 0)


async def test_decoded_size_at_and_just_over_10_mib(client, host):
    header = samples["image/png"]
    at_limit = header + b"\0" * (media_bytes_max - len(header))
    response = await client.post(media_path, json=upload("image/png", at_limit))
    assert response.status_code == 201, response.text
    assert response.json()["size_bytes"] == media_bytes_max == 10_485_760
    over = await client.post(media_path, json=upload("image/png", at_limit + b"\0"))
    assert_error(over, 413, "payload_too_large")
    assert fields_of(over) == ["body.data_base64"]
    assert (await counts(host))[0] == 1


async def test_transfer_body_at_and_just_over_14_mib(client, host):
    document = upload("image/png", samples["image/png"] + b"\0" * (media_bytes_max - 16))
    encoded = json.dumps(document).encode()
    padded = encoded[:-1] + b" " * (media_body_bytes_max - len(encoded)) + b"}"
    assert len(padded) == media_body_bytes_max
    response = await client.post(media_path, content=padded, headers={"Content-Type": "application/json"})
    assert response.status_code == 201, response.text
    over = padded[:-1] + b" }"
    response = await client.post(media_path, content=over, headers={"Content-Type": "application/json"})
    assert_error(response, 413, "payload_too_large")
    # Counted while streaming: a chunked body with no Content-Length is cut at the limit too.
    auth = {"Authorization": client.headers["authorization"]}
    streamed = await raw_upload(host.port, media_path, headers=auth, body_bytes=media_body_bytes_max + 256 * 1024,
                                chunked=True, chunk_bytes=1024 * 1024)
    assert streamed.status == 413
    assert (await counts(host))[0] == 1


async def test_understanding_text_limit_and_blank_means_not_understood(client, host):
    at_limit = "猫" * (32768 // 3) + "ab"
    assert len(at_limit.encode()) == 32768
    understood = await client.post(media_path, json=upload(understanding_text=at_limit))
    assert understood.status_code == 201
    body = understood.json()
    assert body["understanding_source"] == "host" and body["understanding_text"] == at_limit
    assert body["completed_at"].endswith("+00:00") and body["last_error"] is None
    over = await client.post(media_path, json=upload(understanding_text=at_limit + "c"))
    assert_error(over, 413, "payload_too_large")
    assert fields_of(over) == ["body.understanding_text"]
    for blank in ("", "  \n ", None):
        response = await client.post(media_path, json=upload(understanding_text=blank))
        assert response.json()["understanding_source"] is None
        assert response.json()["understanding_text"] is None and response.json()["completed_at"] is None
    audio = await client.post(media_path, json=upload("audio/ogg", understanding_text="一段鸟叫"))
    assert audio.json()["understanding_source"] == "host"


async def test_identical_bytes_share_one_file_with_distinct_ids_and_each_has_its_record(client, host):
    first = (await client.post(media_path, json=upload(understanding_text="窗边有猫。"))).json()
    second = (await client.post(media_path, json=upload())).json()
    assert first["id"] != second["id"] and first["sha256"] == second["sha256"]
    assert first["understanding_text"] == "窗边有猫。" and second["understanding_text"] is None
    assert await counts(host) == (2, 1, 2)
    records = await host.rows("SELECT operation, object_type, object_id, source, details_json FROM admin_operations ORDER BY id")
    assert records == [
        ("media_uploaded", "media", first["id"], "astrbot-connector", json.dumps({"entry_id": entry})),
        ("media_uploaded", "media", second["id"], "astrbot-connector", json.dumps({"entry_id": entry})),
    ]
    assert "窗边有猫" not in records[0][4]  # the record holds no file and no understanding


async def test_messages_reference_uploads_in_order_and_retries_keep_their_references(client, host):
    ids = [(await client.post(media_path, json=upload(content_type))).json()["id"]
           for content_type in ("image/png", "audio/wav", "video/webm")]
    path = f"/api/v1/entries/{entry}/messages"
    accepted = await client.post(path, json=message("photo", media_ids=[ids[2], ids[0], ids[1]]))
    assert accepted.status_code == 200, accepted.text
    rows = await host.rows("SELECT position, media_id FROM host_message_media ORDER BY position")
    assert rows == [(0, ids[2]), (1, ids[0]), (2, ids[1])]
    # A retry of the same dedupe key is not re-validated and keeps the original references.
    retry = await client.post(path, json=message("photo", media_ids=["media_gone"]))
    assert retry.json()["message_ids"] == accepted.json()["message_ids"]
    assert len(await host.rows("SELECT * FROM host_message_media")) == 3
    # The same object may be referenced by several messages and entries.
    again = await client.post("/api/v1/entries/astrbot:group-b/messages", json=message("p2", media_ids=[ids[0]]))
    assert again.status_code == 200


async def test_unknown_foreign_and_cleaned_objects_are_404(client, host):
    path = f"/api/v1/entries/{entry}/messages"
    unknown = await client.post(path, json=message("u", media_ids=["media_000000000000deadbeefdeadbeef"]))
    assert_error(unknown, 404, "media_not_found")
    # An internal object without its media_uploaded record is not a host upload.
    stored = (await client.post(media_path, json=upload())).json()
    await host.engine.write(lambda connection: connection.execute("DELETE FROM admin_operations"))
    foreign = await client.post(path, json=[message("ok"), message("f", media_ids=[stored["id"]])])
    assert_error(foreign, 404, "media_not_found")
    assert fields_of(foreign) == ["body[1].media_ids[0]"]
    assert await host.rows("SELECT count(*) FROM host_messages") == [(0,)]
    cleaned = (await client.post(media_path, json=upload("image/gif"))).json()
    host.clock.advance(media_grace_seconds + 1)
    await host.system.ref(media_kind_name, media_store_key).ask(SweepMedia(), timeout=10)
    response = await client.post(path, json=message("c", media_ids=[cleaned["id"]]))
    assert_error(response, 404, "media_not_found")


async def test_scope_rules_for_upload_and_reference(host):
    uploader = await host.token("uploader", TokenScope.of_entries(["astrbot:a"]))
    narrow = await host.token("narrow", TokenScope.of_entries(["astrbot:b"]))
    both = await host.token("both", TokenScope.of_prefix("astrbot:"))
    async with host.client(uploader) as client:
        forbidden = await client.post(media_path, json=upload() | {"entry_id": "astrbot:b"})
        assert_error(forbidden, 403, "entry_forbidden")
        assert fields_of(forbidden) == ["body.entry_id"]
        media_id = (await client.post(media_path, json=upload() | {"entry_id": "astrbot:a"})).json()["id"]
    assert (await counts(host))[0] == 1
    # Guessing an id grants nothing: the upload's entry must be in the referencing token's scope.
    async with host.client(narrow) as client:
        response = await client.post("/api/v1/entries/astrbot:b/messages", json=message("n", media_ids=[media_id]))
        assert_error(response, 404, "media_not_found")
    async with host.client(both) as client:
        response = await client.post("/api/v1/entries/astrbot:b/messages", json=message("n", media_ids=[media_id]))
        assert response.status_code == 200, response.text


async def test_grace_cleanup_keeps_referenced_files_and_deletes_unreferenced_ones(client, host):
    referenced = (await client.post(media_path, json=upload())).json()
    sharing = (await client.post(media_path, json=upload())).json()  # same bytes, never referenced
    alone = (await client.post(media_path, json=upload("audio/flac"))).json()
    assert (await client.post(f"/api/v1/entries/{entry}/messages",
                              json=message("m", media_ids=[referenced["id"]]))).status_code == 200
    store = host.system.ref(media_kind_name, media_store_key)
    host.clock.advance(media_grace_seconds - 60)
    early = await store.ask(SweepMedia(), timeout=10)
    assert (early.objects_cleaned, early.files_deleted) == (0, 0)
    host.clock.advance(61)
    swept = await store.ask(SweepMedia(), timeout=10)
    assert (swept.objects_cleaned, swept.files_deleted) == (2, 1)
    rows = await host.rows("SELECT id, cleaned_at IS NOT NULL FROM host_media ORDER BY uploaded_at, id")
    assert sorted(rows) == sorted([(referenced["id"], 0), (sharing["id"], 1), (alone["id"], 1)])
    assert await host.rows("SELECT sha256 FROM blobs") == [(referenced["sha256"],)]
    # Referenced files are never deleted, however old.
    host.clock.advance(30 * media_grace_seconds)
    assert (await store.ask(SweepMedia(), timeout=10)).objects_cleaned == 0
    assert (await client.post(f"/api/v1/entries/{entry}/messages",
                              json=message("again", media_ids=[referenced["id"]]))).status_code == 200


async def test_the_sweep_runs_from_a_durable_reminder(client, host):
    media_id = (await client.post(media_path, json=upload())).json()["id"]
    reminders = await host.rows("SELECT kind, key, name, due_wall FROM reminders")
    assert [row[:3] for row in reminders] == [(media_kind_name, media_store_key, "sweep")]
    assert reminders[0][3] == pytest.approx(host.clock.wall() + media_sweep_interval_seconds, abs=5)
    host.clock.advance(media_grace_seconds + media_sweep_interval_seconds)
    with trio.fail_after(5):  # the reminder service re-reads the wall clock at least every second
        while (await host.rows("SELECT cleaned_at IS NOT NULL FROM host_media WHERE id = ?", media_id)) != [(1,)]:
            await trio.sleep(0.05)
    with trio.fail_after(5):  # re-armed for the next sweep
        while not (rows := await host.rows("SELECT due_wall FROM reminders")) or rows[0][0] <= host.clock.wall():
            await trio.sleep(0.05)
