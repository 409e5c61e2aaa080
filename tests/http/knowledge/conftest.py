import pytest

from ._knowledge_harness import start_knowledge_server


@pytest.fixture
async def knowledge_server(nursery, tmp_path):
    return await start_knowledge_server(nursery, str(tmp_path / "data"))


@pytest.fixture
async def client(knowledge_server):
    async with knowledge_server.client() as client:
        yield client
