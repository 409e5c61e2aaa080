"""The simulated network: routing, seeded refusals and hangs, no sockets."""

import httpx
import pytest
import trio

from troupe.sim import NetworkFaults, SimRandom, SimulatedNetwork, simulated_http_client


async def echo(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"path": request.url.path, "body": request.content.decode()})


async def test_requests_reach_the_routed_handler():
    network = SimulatedNetwork(SimRandom(1))
    network.route("hooks.example", echo)
    async with simulated_http_client(network) as client:
        response = await client.post("http://hooks.example/turn-end", content="hi")
    assert response.json() == {"path": "/turn-end", "body": "hi"}
    assert network.requests == [("POST", "http://hooks.example/turn-end")]


async def test_unknown_host_is_refused():
    async with simulated_http_client(SimulatedNetwork(SimRandom(1))) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://nowhere.example/")


async def test_seeded_faults_repeat_exactly(autojump_clock):
    async def outcomes(seed):
        network = SimulatedNetwork(SimRandom(seed), NetworkFaults(refuse_probability=0.3, hang_probability=0.2))
        network.route("target", echo)
        results = []
        async with simulated_http_client(network) as client:
            for _ in range(40):
                try:
                    await client.get("http://target/", timeout=5)
                    results.append("ok")
                except httpx.ConnectError:
                    results.append("refused")
                except httpx.TimeoutException:
                    results.append("hung")
        return results, network.faults.refused, network.faults.hung

    first = await outcomes(3)
    assert first == await outcomes(3)
    assert {"ok", "refused", "hung"} <= set(first[0])
    assert first[1] == first[0].count("refused")


async def test_the_sim_env_wires_every_port(tmp_path):
    from troupe.sim import sim_env

    env = sim_env(5, str(tmp_path))
    assert env.model is not None and env.embedder is not None and env.http is not None
    vectors = await env.embedder.embed(["今晚看星星"], purpose="query")
    assert vectors.shape == (1, env.embedder.dimensions)
    await env.http.aclose()
    assert trio.current_time() >= 0
