import pytest

from ._character_harness import start_character_server


@pytest.fixture
async def character_server(nursery, tmp_path):
    return await start_character_server(nursery, str(tmp_path / "data"))


@pytest.fixture
async def client(character_server):
    async with character_server.client() as client:
        yield client
