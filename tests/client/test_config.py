"""The client's configuration is one frozen, picklable value: ClientConfig."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from envlink import (
    ClientConfig,
    ConnectionOptions,
    EnvClient,
    FleetLimits,
    GenericEnvClient,
    HarnessClient,
    Limits,
    ReconnectPolicy,
    RetryBudget,
    Timeout,
)
from envlink._client.client import configured_client
from envlink._client.configuration import (
    CLIENT_OPTIONS,
    COMMON_OPTIONS,
    CONFIG_KEYWORDS,
    OPENENV_OPTIONS,
)
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(30)

URL = "ws://127.0.0.1:9"  # nothing is connected: the clients are only built


def same_data(recorded: dict[str, Any], actual: dict[str, Any]) -> bool:
    """A replay checker that pickles (module level)."""
    return recorded.get("observation") == actual.get("observation")


def full_config() -> ClientConfig:
    return ClientConfig(
        timeout=Timeout(5.0, connect=2.0, probe=1.0),
        options=ConnectionOptions(headers=(("Authorization", "Bearer s3cret"),),
                                  ping_interval=None, max_message_size=4096,
                                  compression="deflate", proxy=None),
        reconnect=ReconnectPolicy(max_attempts=3, budget=RetryBudget()),
        on_session_lost="replay", replay_verify=same_data, max_journal_steps=10,
        extensions=False, mode="production", limits=Limits(max_sessions_per_endpoint=2),
        on_capacity="wait")


def test_a_client_keeps_the_config_it_is_given_and_it_pickles() -> None:
    """EnvClient(url, config=cfg).config is cfg, and it survives pickling equal."""
    cfg = full_config()
    client = GenericEnvClient(URL, config=cfg)
    assert client.config is cfg and client.config == cfg
    assert pickle.loads(pickle.dumps(client.config)) == client.config
    assert (client.timeouts, client.reconnect_policy, client.on_session_lost, client.mode) == (
        cfg.timeout, cfg.reconnect, "replay", "production")


def test_the_keyword_constructor_builds_an_equal_picklable_config() -> None:
    """The keyword path builds a ClientConfig equal to the one written out, and it pickles."""
    client = GenericEnvClient(URL, timeout=Timeout(5.0, connect=2.0, probe=1.0),
                              headers={"Authorization": "Bearer s3cret"}, ping_interval=None,
                              max_message_size=4096, compression="deflate", proxy=None,
                              reconnect=ReconnectPolicy(max_attempts=3),
                              on_session_lost="replay", replay_verify=same_data,
                              max_journal_steps=10, extensions=False, mode="production",
                              limits=Limits(max_sessions_per_endpoint=2), on_capacity="wait")
    assert client.config == full_config()
    assert pickle.loads(pickle.dumps(client.config)) == client.config
    assert GenericEnvClient(URL).config == ClientConfig()


def test_openenv_aliases_are_resolved_into_the_config() -> None:
    """connect_timeout_s, message_timeout_s, max_message_size_mb and the two ping aliases
    become the Timeout and ConnectionOptions fields, in from_keywords as in the client."""
    openenv = {"connect_timeout_s": 3.0, "message_timeout_s": 7.0, "max_message_size_mb": 2,
               "websocket_ping_interval_s": None, "websocket_ping_timeout_s": 4.0}
    expected = ClientConfig(
        timeout=Timeout(connect=3.0, call=7.0),
        options=ConnectionOptions(ping_interval=None, ping_timeout=4.0,
                                  max_message_size=2 * 1024 * 1024))
    assert ClientConfig.from_keywords(**openenv) == expected
    assert GenericEnvClient(URL, **openenv).config == expected
    # The alias wins over the plain keyword, as in OpenEnv.
    assert ClientConfig.from_keywords(ping_interval=5.0, websocket_ping_interval_s=9.0
                                      ).options.ping_interval == 9.0


def test_the_keywords_are_declared_once() -> None:
    """EnvClient names OpenEnv's own keywords and takes envlink's as **options of
    ClientOptions; from_keywords takes both declarations, nothing else, and each
    keyword is a field of the config, of its ConnectionOptions, or an OpenEnv alias."""
    named = {n: p for n, p in inspect.signature(EnvClient.__init__).parameters.items()
             if p.kind is inspect.Parameter.KEYWORD_ONLY}
    for target in ("provider", "token", "config"):
        named.pop(target)
    assert set(named) == OPENENV_OPTIONS
    # Their defaults leave the configuration alone.
    assert ClientConfig.from_keywords(**{n: p.default for n, p in named.items()}
                                      ) == ClientConfig()
    rest = inspect.signature(EnvClient.__init__).parameters["options"]
    assert rest.kind is inspect.Parameter.VAR_KEYWORD
    assert rest.annotation == "Unpack[ClientOptions]"
    assert CONFIG_KEYWORDS == CLIENT_OPTIONS | OPENENV_OPTIONS
    assert COMMON_OPTIONS < CLIENT_OPTIONS  # the harness client's, a part of them
    harness = inspect.signature(HarnessClient.__init__).parameters
    assert list(harness) == ["self", "base_url", "options"]
    assert harness["options"].annotation == "Unpack[CommonOptions]"
    assert not CLIENT_OPTIONS & OPENENV_OPTIONS
    aliases = {"connect_timeout_s", "message_timeout_s", "max_message_size_mb",
               "websocket_ping_interval_s", "websocket_ping_timeout_s"}
    fields = {f.name for f in dataclasses.fields(ClientConfig)}
    connection = {f.name for f in dataclasses.fields(ConnectionOptions)}
    assert fields | connection | aliases >= CONFIG_KEYWORDS
    assert aliases | {"mode"} == OPENENV_OPTIONS


SAMPLES: dict[str, Any] = {
    "timeout": 5.0, "headers": {"Authorization": "Bearer s3cret"},
    "reconnect": ReconnectPolicy(max_attempts=3), "on_session_lost": "replay",
    "replay_verify": same_data, "max_journal_steps": 10, "ping_interval": None,
    "ping_timeout": 3.0, "max_message_size": 4096, "compression": "deflate",
    "ssl": None, "proxy": None, "extensions": False, "tracer_provider": TracerProvider(),
    "meter_provider": None, "transport": None, "options": ConnectionOptions(proxy=None),
    "hooks": [], "limits": Limits(max_sessions_per_endpoint=2), "on_capacity": "wait",
    "recorder": None, "connect_timeout_s": 3.0, "message_timeout_s": 7.0,
    "max_message_size_mb": 2, "websocket_ping_interval_s": None,
    "websocket_ping_timeout_s": 4.0, "mode": "production",
    # A value only: no store is touched until a session opens.
    "fleet": FleetLimits("/nonexistent/envlink-fleet", max_sessions=8),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_keyword_builds_the_same_config_in_the_client(name: str) -> None:
    """Each keyword, given alone, makes the client's config from_keywords' config."""
    assert set(SAMPLES) == CONFIG_KEYWORDS
    given = {name: SAMPLES[name]}
    assert GenericEnvClient(URL, **given).config == ClientConfig.from_keywords(**given)


def test_a_misspelled_keyword_is_a_type_error() -> None:
    """A keyword that is neither declared nor named raises TypeError naming it, as
    Python does, with the closest name; in a subclass passing it to EnvClient too."""
    with pytest.raises(TypeError, match=r"GenericEnvClient\(\) got an unexpected keyword "
                                        r"argument 'timeot'; did you mean 'timeout'\?"):
        GenericEnvClient(URL, timeot=3.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzz'$"):
        GenericEnvClient(URL, zzz=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"from_keywords\(\) got an unexpected keyword "
                                        r"argument 'provider'"):
        ClientConfig.from_keywords(provider=object())  # type: ignore[call-arg]

    class Mine(GenericEnvClient):
        def __init__(self, base_url: str | None = None, **kwargs: Any) -> None:
            super().__init__(base_url, on_sesion_lost="replay", **kwargs)

    with pytest.raises(TypeError, match=r"Mine\(\) got an unexpected keyword argument "
                                        "'on_sesion_lost'"):
        Mine(URL)
    # Built whole from a config (new_session(), a pool), it is refused as well.
    with pytest.raises(TypeError, match="on_sesion_lost"):
        configured_client(Mine, URL, ClientConfig())
    # The harness client takes the common keywords alone.
    with pytest.raises(TypeError, match=r"HarnessClient\(\) got an unexpected keyword "
                                        r"argument 'reconnect'"):
        HarnessClient(URL, reconnect=ReconnectPolicy())  # type: ignore[call-arg]
    assert HarnessClient(URL, timeout=3.0, hooks=[]).timeouts == Timeout(3.0)


def test_a_subclass_forwarding_keywords_keeps_them() -> None:
    """A client class of one's own that passes **kwargs to EnvClient keeps working."""
    class Mine(GenericEnvClient):
        def __init__(self, base_url: str | None = None, *, level: int = 0,
                     **kwargs: Any) -> None:
            super().__init__(base_url, **kwargs)
            self.level = level

    client = Mine(URL, level=2, on_session_lost="replay", message_timeout_s=7.0)
    assert client.level == 2
    assert client.config == ClientConfig(on_session_lost="replay",
                                         timeout=Timeout(call=7.0))
    child = configured_client(Mine, URL, client.config)
    assert child.config is client.config


def test_config_and_keywords_that_set_it_too_are_refused() -> None:
    """config= with configuration keywords raises a ValueError naming what they set;
    keywords left at their defaults, and where the server is, are fine."""
    cfg = ClientConfig(on_session_lost="replay")
    with pytest.raises(ValueError, match=r"config= or as keyword.*timeout, on_session_lost"):
        GenericEnvClient(URL, config=cfg, timeout=3.0, on_session_lost="auto")
    with pytest.raises(ValueError, match="options"):
        GenericEnvClient(URL, config=cfg, websocket_ping_interval_s=1.0)
    assert GenericEnvClient(URL, config=cfg, on_session_lost="raise", token="t").config is cfg
    with pytest.raises(TypeError, match="config must be a ClientConfig"):
        GenericEnvClient(URL, config={"timeout": 3.0})  # type: ignore[arg-type]


def test_a_config_is_frozen_down_to_its_timeout() -> None:
    """Assigning a field of a config, or of its Timeout, raises."""
    cfg = ClientConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.on_session_lost = "replay"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        cfg.timeout.call = 1.0  # type: ignore[misc]
    changed = dataclasses.replace(cfg, timeout=Timeout(1.0))
    assert changed.timeout.call == 1.0 and cfg.timeout.call == 60.0


@pytest.mark.parametrize(("fields", "error", "match"), [
    ({"on_session_lost": "retry"}, ValueError, "on_session_lost must be"),
    ({"timeout": 5.0}, TypeError, "timeout must be a Timeout"),
    ({"reconnect": None}, TypeError, "reconnect must be a ReconnectPolicy"),
    ({"max_journal_steps": -1}, ValueError, "max_journal_steps"),
    ({"on_capacity": "queue"}, ValueError, "on_capacity"),
    ({"mode": "staging"}, ValueError, "mode must be"),
    ({"limits": 3}, TypeError, "limits must be"),
    ({"replay_verify": "equal"}, TypeError, "replay_verify must be callable"),
    ({"hooks": "mine"}, TypeError, "hooks must be"),
])
def test_bad_parts_are_refused_when_the_config_is_made(
        fields: dict[str, Any], error: type[Exception], match: str) -> None:
    """A part of the wrong type or out of range raises at ClientConfig(...), typed."""
    with pytest.raises(error, match=match):
        ClientConfig(**fields)


def test_what_does_not_pickle_says_so() -> None:
    """A config with OpenTelemetry providers refuses pickling with a clear TypeError; its
    repr shows only what differs from the defaults, and no header value."""
    cfg = ClientConfig(tracer_provider=TracerProvider())
    with pytest.raises(TypeError, match="tracer_provider cannot be pickled"):
        pickle.dumps(cfg)
    shown = repr(full_config())
    assert "s3cret" not in shown and "on_session_lost='replay'" in shown
    assert "extensions=False" in shown and "on_capacity='wait'" in shown
    assert repr(ClientConfig()) == "ClientConfig()"


def test_setters_replace_the_config() -> None:
    """reconnect_policy and on_session_lost set on a client show in client.config."""
    client = GenericEnvClient(URL)
    policy = ReconnectPolicy(max_attempts=2)
    client.reconnect_policy = policy
    client.on_session_lost = "auto"
    assert client.config.reconnect is policy and client.config.on_session_lost == "auto"


class FixedOptionsEnv(GenericEnvClient):
    """A typed client whose own __init__ takes no configuration keywords at all."""

    def __init__(self, base_url: str, greeting: str = "hello") -> None:
        super().__init__(base_url, timeout=5.0, on_session_lost="replay")
        self.greeting = greeting


class ForwardingEnv(GenericEnvClient):
    """A typed client whose own __init__ passes its keyword arguments on."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.built = True


@pytest.mark.parametrize("cls", [GenericEnvClient, FixedOptionsEnv, ForwardingEnv])
async def test_new_session_builds_the_child_from_the_config(
        server: EnvServer, cls: type[GenericEnvClient]) -> None:
    """new_session() gives a child of the same class with the parent's config, whatever the
    class's own __init__ takes, and the child's own __init__ runs."""
    parent = (cls(server.url) if cls is FixedOptionsEnv
              else cls(server.url, timeout=5.0, on_session_lost="replay"))
    try:
        parent.on_session_lost = "auto"  # the config the parent runs with, now
        child = await parent.new_session()
        assert type(child) is cls and child.connected
        assert child.config == parent.config
        assert child.config.on_session_lost == "auto" and child.timeouts.call == 5.0
        assert vars(child).keys() == vars(parent).keys()  # the subclass's __init__ ran
        await child.reset()
    finally:
        await parent.close()
    assert child.closed


async def test_attach_builds_its_client_from_a_config() -> None:
    """EnvClient.attach(handle, config=cfg) continues the session with cfg (its "raise",
    which could never re-attach, made "resume"); config= with keywords is refused."""
    from envlink.server import ServerThread

    with ServerThread(env="deterministic") as st:
        env = GenericEnvClient(st.url)
        await env.reset(seed=1, max_steps=50)
        await env.step({"move": 2})
        handle = await env.detach()
        cfg = ClientConfig(timeout=Timeout(7.0), max_journal_steps=100)
        with pytest.raises(ValueError, match="not both"):
            await GenericEnvClient.attach(handle, config=cfg, timeout=3.0)
        attached = await FixedOptionsEnv.attach(handle, config=cfg)
        try:
            assert type(attached) is FixedOptionsEnv
            assert attached.config == dataclasses.replace(cfg, on_session_lost="resume")
            assert (await attached.state())["step_count"] == 1
        finally:
            await attached.close()
