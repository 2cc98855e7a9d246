"""The training adapters build their clients from one ClientConfig; the old mapping of
client keyword arguments is turned into one once."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterator

import pytest

from envlink import ClientConfig, GenericEnvClient, ReconnectPolicy, Timeout
from envlink.integrations.openenv_harness import DEFAULT_CLIENT_CONFIG, EnvlinkSessionFactory
from envlink.server import ServerThread

from ._envs import Echo

pytestmark = pytest.mark.timeout(60)

CONFIG = ClientConfig(timeout=Timeout(10.0), reconnect=ReconnectPolicy(max_attempts=2),
                      on_session_lost="auto", on_capacity="wait")


class OwnInitClient(GenericEnvClient):
    """A client class whose own __init__ passes configuration keywords of its own."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url, timeout=1.0)


@pytest.fixture
def echo_server() -> Iterator[ServerThread]:
    """An echo server with extensions, in its own thread."""
    with ServerThread(env="echo", ping_interval=None) as st:
        yield st


def test_harness_sessions_run_with_the_factorys_config(echo_server: ServerThread) -> None:
    """Each session a factory creates has a client with exactly the factory's config."""
    factory = EnvlinkSessionFactory(echo_server.url, client_class=OwnInitClient,
                                    client_config=CONFIG, create_timeout=20)
    assert factory.client_config is CONFIG
    with factory.create("hello") as session:
        client = session.client.async_client
        assert type(client) is OwnInitClient and client.config is CONFIG


def test_harness_defaults_and_the_old_mapping() -> None:
    """No config: the adapters' defaults; client_options (deprecated) over those defaults,
    made into a config; both at once, or a key that is no configuration, is refused."""
    assert EnvlinkSessionFactory("ws://127.0.0.1:9").client_config == DEFAULT_CLIENT_CONFIG
    assert ClientConfig(on_session_lost="auto", on_capacity="wait") == DEFAULT_CLIENT_CONFIG
    old = EnvlinkSessionFactory("ws://127.0.0.1:9", client_options={
        "timeout": 10.0, "reconnect": ReconnectPolicy(max_attempts=2)})
    assert old.client_config == CONFIG
    with pytest.raises(ValueError, match="not both"):
        EnvlinkSessionFactory("ws://127.0.0.1:9", client_config=CONFIG,
                              client_options={"timeout": 1.0})
    with pytest.raises(TypeError, match="not client configuration: token"):
        EnvlinkSessionFactory("ws://127.0.0.1:9", client_options={"token": "t"})


def test_a_trl_environment_builds_its_client_from_its_config(echo_server: ServerThread) -> None:
    """client_config (class attribute or per instance, pickled with it) is the client's
    config exactly; client_options (deprecated) is turned into one over the defaults."""
    env = pickle.loads(pickle.dumps(Echo(base_url=echo_server.url, client_config=CONFIG)))
    old = Echo(base_url=echo_server.url, client_options={"timeout": 10.0})
    plain = Echo(base_url=echo_server.url)
    try:
        assert env.client.async_client.config == CONFIG
        assert old.client.async_client.config == dataclasses.replace(
            DEFAULT_CLIENT_CONFIG, timeout=Timeout(10.0))
        assert plain.client.async_client.config is DEFAULT_CLIENT_CONFIG
        assert env.reset() is None  # and it works against the server
    finally:
        for each in (env, old, plain):
            each._release()
    with pytest.raises(ValueError, match="not both"):
        _ = Echo(base_url=echo_server.url, client_config=CONFIG,
                 client_options={"timeout": 1.0}).client
