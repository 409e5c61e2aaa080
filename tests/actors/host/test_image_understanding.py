"""Image understanding for learning, on a real engine and actor system: host text reused as
given, other images described after the batch is claimed (each object once, written back to
``host_media`` and reused by later batches), one budget per batch, failures as
``[图片，未理解]`` (retried by a later batch), refusals as ``敏感信息无法访问`` (final), audio and
video never sent to a model, a model that cannot see never asked; and the same end to end over
real HTTP with the OpenAIChatModel against an OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import base64

import trio

from tests.http.host._host_harness import MovableClock, message, start_host_server
from tests.models.openai_compatible_server import (
    content_filter_body,
    image_description,
    open_openai_compatible_server,
)
from troupe.actors.host import (
    AcceptMessages,
    LearnNow,
    NewMessage,
    entry_actor_kind,
    host_migrations,
    learner_actor_kind,
    save_host_media,
)
from troupe.actors.host import _learning as learning
from troupe.auth import TokenGrant, TokenScope, auth_migrations
from troupe.models import LocalModel, ModelRefused, ModelTimeout, OpenAIChatModel
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine

grant = TokenGrant(1, "connector", TokenScope.all())
png = b"\x89PNG\r\n\x1a\n" + b"cat by the window"
jpeg = b"\xff\xd8\xff" + b"a bowl of noodles"
gif = b"GIF89a" + b"a sunset"
ogg = b"OggS" + b"\x00" * 32
mp4 = b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 16


class SeeingModel:
    """Learns like the LocalModel and describes images as scripted (a description by default);
    records every learning request and every image it was shown."""

    name = "seeing"
    capabilities = frozenset({"json_object", "describe_image"})

    def __init__(self, script: dict[bytes, BaseException | float] | None = None) -> None:
        self.script = script or {}
        self.local = LocalModel()
        self.learning_texts: list[str] = []
        self.shown: list[tuple[bytes, str, float]] = []

    async def complete(self, request):
        self.learning_texts.append(request.messages[-1].content)
        return await self.local.complete(request)

    async def describe_image(self, image_bytes, content_type, *, budget_seconds):
        self.shown.append((image_bytes, content_type, budget_seconds))
        scripted = self.script.get(image_bytes)
        if isinstance(scripted, BaseException):
            raise scripted
        if isinstance(scripted, float):
            await trio.sleep(scripted)
        return f"看见了{image_bytes[-7:].decode()}"


class World:
    def __init__(self, path: str, model) -> None:
        self.path = path
        self.model = model
        self.system: ActorSystem | None = None
        self.uploads = 0
        self.messages = 0

    async def start(self, nursery: trio.Nursery) -> ActorSystem:
        env = real_env(self.path)
        env.clock = MovableClock(env.clock)
        env.model = self.model
        engine = await Engine.open(env, nursery=nursery, migrations=[*auth_migrations, *host_migrations])
        self.system = ActorSystem(env, [entry_actor_kind(), learner_actor_kind()], storage=engine)
        await nursery.start(self.system.run)
        return self.system

    async def upload(self, data: bytes, content_type: str, understanding: str | None = None) -> str:
        self.uploads += 1
        media_id = f"media_{self.uploads:028x}"
        await self.system.storage.write(lambda connection: save_host_media(
            connection, media_id=media_id, entry_id="e", content_type=content_type, data=data,
            understanding_text=understanding, source="connector", now=1.0))
        return media_id

    async def learn(self, *media_lists: tuple[str, ...]) -> None:
        """Posts one message per media list to entry ``e`` and learns them as one batch."""
        entry = self.system.ref("entry", "e")
        messages = []
        for media_ids in media_lists:
            self.messages += 1
            messages.append(NewMessage(dedupe_key=f"m{self.messages}", sender="小林", content="看图",
                                       occurred_at="2026-10-10T20:00:00+08:00", occurred_at_seconds=1.0,
                                       media_ids=tuple(media_ids)))
        await entry.ask(AcceptMessages(tuple(messages), grant))
        await entry.ask(LearnNow())
        with trio.fail_after(10):
            while await self.rows("SELECT count(*) FROM host_batches WHERE state IN ('waiting', 'running')") != [(0,)]:
                await trio.sleep(0.02)

    async def rows(self, sql: str, *parameters) -> list[tuple]:
        return await self.system.storage.read(lambda connection: list(connection.execute(sql, parameters)))

    async def understanding(self, media_id: str) -> tuple:
        (row,) = await self.rows("SELECT understanding_source, understanding_text, completed_at IS NOT NULL, "
                                 "last_error FROM host_media WHERE id = ?", media_id)
        return row


async def test_host_text_is_reused_and_other_images_are_described_once_and_stored(tmp_path, nursery):
    model = SeeingModel()
    world = World(str(tmp_path), model)
    await world.start(nursery)
    hosted = await world.upload(png, "image/png", "窗边有猫。")
    fresh = await world.upload(jpeg, "image/jpeg")
    await world.learn((hosted, fresh), (fresh,))
    assert [(data, content_type) for data, content_type, _ in model.shown] == [(jpeg, "image/jpeg")]
    assert model.shown[0][2] <= learning.image_understanding_budget_seconds
    assert await world.understanding(hosted) == ("host", "窗边有猫。", 1, None)
    assert await world.understanding(fresh) == ("model", "看见了noodles", 1, None)
    (text,) = model.learning_texts
    assert text.count("[图片：看见了noodles]") == 2 and "[图片：窗边有猫。]" in text
    assert "\x00" not in text
    assert await world.rows("SELECT state FROM host_batches") == [("succeeded",)]
    # A later batch reuses what was stored: no new call.
    await world.learn((fresh,))
    assert len(model.shown) == 1
    assert "[图片：看见了noodles]" in model.learning_texts[-1]


async def test_failures_fall_back_and_are_retried_later_refusals_are_final(tmp_path, nursery):
    model = SeeingModel({jpeg: ModelTimeout("slow"), gif: ModelRefused("content_filter")})
    world = World(str(tmp_path), model)
    await world.start(nursery)
    failing = await world.upload(jpeg, "image/jpeg")
    refused = await world.upload(gif, "image/gif")
    await world.learn((failing, refused))
    text = model.learning_texts[-1]
    assert "[图片，未理解]" in text and "敏感信息无法访问" in text
    source, stored, completed, error = await world.understanding(failing)
    assert (source, stored, completed) == (None, None, 0) and error.startswith("ModelTimeout")
    source, stored, completed, error = await world.understanding(refused)
    assert (source, stored, completed) == ("model", "敏感信息无法访问", 1) and error.startswith("ModelRefused")
    assert await world.rows("SELECT state FROM host_batches") == [("succeeded",)]
    # The next batch tries the failed image again, never the refused one.
    del model.script[jpeg]
    await world.learn((failing, refused))
    assert [data for data, _, _ in model.shown] == [jpeg, gif, jpeg]
    assert await world.understanding(failing) == ("model", "看见了noodles", 1, None)
    assert "[图片：看见了noodles]" in model.learning_texts[-1]


async def test_the_batch_shares_one_budget_across_its_images(tmp_path, nursery, monkeypatch):
    monkeypatch.setattr(learning, "image_understanding_budget_seconds", 0.5)
    model = SeeingModel({png: 0.3, jpeg: 5.0})
    world = World(str(tmp_path), model)
    await world.start(nursery)
    first, second, third = [await world.upload(*upload) for upload in
                            ((png, "image/png"), (jpeg, "image/jpeg"), (gif, "image/gif"))]
    await world.learn((first, second, third))
    assert [data for data, _, _ in model.shown] == [png, jpeg]  # the third was never started
    budgets = [budget for _, _, budget in model.shown]
    assert 0.45 < budgets[0] <= 0.5 and budgets[1] < 0.25
    assert (await world.understanding(first))[0] == "model"
    assert (await world.understanding(second))[3].startswith("budget")
    assert await world.understanding(third) == (None, None, 0, None)
    assert model.learning_texts[-1].count("[图片，未理解]") == 2


async def test_audio_and_video_are_placeholders_and_a_blind_model_is_never_asked(tmp_path, nursery):
    model = SeeingModel()
    world = World(str(tmp_path), model)
    await world.start(nursery)
    audio = await world.upload(ogg, "audio/ogg", "有人在唱歌")
    video = await world.upload(mp4, "video/mp4")
    await world.learn((audio, video))
    assert model.shown == []
    assert "[音频] [视频]" in model.learning_texts[-1] and "唱歌" not in model.learning_texts[-1]
    assert await world.understanding(video) == (None, None, 0, None)

    blind = SeeingModel()
    blind.capabilities = frozenset({"json_object"})
    world = World(str(tmp_path / "blind"), blind)
    async with trio.open_nursery() as inner:
        await world.start(inner)
        image = await world.upload(png, "image/png")
        await world.learn((image,))
        assert blind.shown == [] and "[图片，未理解]" in blind.learning_texts[-1]
        assert await world.understanding(image) == (None, None, 0, None)
        inner.cancel_scope.cancel()


async def test_images_are_understood_over_http_by_an_openai_compatible_model(tmp_path, nursery):
    async with open_openai_compatible_server() as provider:
        host = await start_host_server(nursery, str(tmp_path / "data"))
        model = OpenAIChatModel(provider.base_url, None, "vision-model")
        host.env.model = model
        secret = await host.token("astrbot")
        entry = "astrbot:group-a"
        async with host.client(secret) as client:
            media = {}
            for name, data, content_type in (("png", png, "image/png"), ("jpeg", jpeg, "image/jpeg"),
                                             ("ogg", ogg, "audio/ogg")):
                response = await client.post("/api/v1/media", json={
                    "entry_id": entry, "content_type": content_type,
                    "data_base64": base64.b64encode(data).decode()})
                assert response.status_code == 201, response.text
                assert response.json()["understanding_source"] is None  # the state at upload time
                media[name] = response.json()["id"]
            provider.fail_next(1, status=400, body=content_filter_body)  # the first image: refused
            posted = await client.post(f"/api/v1/entries/{entry}/messages", json=[
                message("a", media_ids=[media["png"], media["ogg"]]), message("b", media_ids=[media["jpeg"]])])
            assert posted.status_code == 200, posted.text
            assert (await client.post(f"/api/v1/entries/{entry}/learn")).status_code == 200
            with trio.fail_after(10):
                while (await host.rows("SELECT state FROM host_batches")) != [("succeeded",)]:
                    await trio.sleep(0.05)
        await model.aclose()
        assert provider.images() == [("image/png", png), ("image/jpeg", jpeg)]
        rows = await host.rows("SELECT id, understanding_source, understanding_text, last_error IS NULL "
                               "FROM host_media ORDER BY id")
        by_id = {media_id: rest for media_id, *rest in rows}
        assert by_id[media["png"]] == ["model", "敏感信息无法访问", 0]
        assert by_id[media["jpeg"]] == ["model", image_description("image/jpeg", jpeg), 1]
        assert by_id[media["ogg"]] == [None, None, 1]
        learning_body = provider.requests[-1].body
        material = learning_body["messages"][-1]["content"]
        assert "敏感信息无法访问" in material and "[音频]" in material
        assert f"[图片：{image_description('image/jpeg', jpeg)}]" in material
