import pytest

from ._sessions_harness import start_sessions_server


@pytest.fixture
async def sessions(nursery, tmp_path):
    return await start_sessions_server(nursery, str(tmp_path / "data"))


@pytest.fixture
async def secret(sessions):
    """An end-user token for ``u_1`` named ``phone``."""
    return await sessions.token("phone", "u_1")


@pytest.fixture
async def client(sessions, secret):
    async with sessions.client(secret) as client:
        yield client
