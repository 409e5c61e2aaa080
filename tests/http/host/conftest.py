import pytest

from ._host_harness import start_host_server


@pytest.fixture
async def host(nursery, tmp_path):
    return await start_host_server(nursery, str(tmp_path / "data"))


@pytest.fixture
async def client(host):
    """An HTTP client holding an all-entries token named ``astrbot-connector``; shared by the
    route tests (a module that needs another token or a frozen clock overrides it)."""
    secret = await host.token("astrbot-connector")
    async with host.client(secret) as client:
        yield client
