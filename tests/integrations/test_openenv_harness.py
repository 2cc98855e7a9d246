"""envlink.integrations.openenv_harness: sessions for harness rollouts, without OpenEnv."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import pytest

from envlink import (
    ClientClosedError,
    ConnectError,
    ConnectionLostError,
    GenericEnvClient,
    HarnessTurnError,
    InvalidArgumentError,
    ReconnectPolicy,
    RetryBudget,
)
from envlink.integrations.openenv_harness import (
    EnvlinkHarnessSession,
    EnvlinkSessionFactory,
    HarnessToolResult,
    HarnessVerifyResult,
)
from envlink.server import ServerThread

from .._processes import ServerProcess

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def one_session_server() -> Iterator[ServerProcess]:
    """``envlink serve --max-sessions 1`` (echo), whose first upgrade is refused."""
    server = ServerProcess("--env", "echo", "--max-sessions", "1", "--refuse", "1")
    yield server
    server.stop()


def _expected_result_types() -> tuple[type, type]:
    """OpenEnv's ``ToolResult`` and ``VerifyResult`` classes where OpenEnv is installed,
    envlink's look-alikes otherwise (imported here, not through the module under test)."""
    try:
        from openenv.core.harness import ToolResult, VerifyResult
    except ImportError:
        return HarnessToolResult, HarnessVerifyResult
    return ToolResult, VerifyResult


def rollout(factory: EnvlinkSessionFactory, text: str) -> tuple[object, object]:
    with factory.create({"prompt": text}, seed=1, episode_id=f"ep-{text}") as session:
        assert session.initial_messages() == [{"role": "user", "content": text}]
        names = [tool.name for tool in session.list_tools()]
        assert names == ["echo_message", "echo_with_length"]
        result = session.call_tool("echo_message", {"message": text})
        return result, session.verify([{"role": "user", "content": text}])


def test_a_conversational_prompt_reaches_the_agent_as_messages(
        one_session_server: ServerProcess) -> None:
    """A TRL conversational task, {"prompt": [messages]}, is the session's messages as
    given, not the text of a Python list; a plain prompt is one user message."""
    conversation = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Say hi."}]
    factory = EnvlinkSessionFactory(one_session_server.url, create_timeout=30)
    with factory.create({"prompt": conversation}) as session:
        assert session.initial_messages() == conversation
    with factory.create(conversation) as session:
        assert session.initial_messages() == conversation
    with factory.create({"prompt": "Say hi."}) as session:
        assert session.initial_messages() == [{"role": "user", "content": "Say hi."}]


def test_create_retries_and_rollouts_share_one_session_slot(
        one_session_server: ServerProcess) -> None:
    """The refused first connect is retried; rollouts run one after another on a one-session
    server and concurrently (the second waits for the first's slot); nothing leaks."""
    factory = EnvlinkSessionFactory(one_session_server.url, create_timeout=30)
    result, verify = rollout(factory, "first")
    # OpenEnv's own ToolResult when it is installed, envlink's look-alike otherwise.
    tool_result, verify_result = _expected_result_types()
    assert type(result) is tool_result and type(verify) is verify_result
    assert result.data == "first" and result.error is None
    assert verify.metrics["tool_calls"] == 1

    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            rollout(factory, f"w{i}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    health = one_session_server.health()
    assert health["counters"]["refused"] == 1
    assert health["counters"]["applied.step"] == 8  # list_tools + one call, per rollout
    assert health["sessions"] == 0
    assert (factory.created, factory.failed) == (4, 0)


def test_tool_errors_are_results_and_reserved_names_are_refused(
        one_session_server: ServerProcess) -> None:
    """A tool's own error is the result's error (the harness contract); orchestration names
    are never forwarded."""
    factory = EnvlinkSessionFactory(one_session_server.url, create_timeout=30)
    with factory.create("hi") as session:
        failed = session.call_tool("no_such_tool", {"message": "x"})
        assert failed.error and "no_such_tool" in failed.error
        with pytest.raises(KeyError, match="reserved"):
            session.call_tool("reset", {})
    assert one_session_server.health()["sessions"] == 0


def test_capture_url_without_a_sampling_policy_is_refused() -> None:
    """capture_url= alone would make plain step sessions that capture nothing: the
    factory refuses it at once and names what is missing; so does loop_owning=False."""
    with pytest.raises(InvalidArgumentError, match=r"capture_url= needs sampling="):
        EnvlinkSessionFactory("ws://127.0.0.1:9", capture_url="http://127.0.0.1:9")
    with pytest.raises(InvalidArgumentError, match="loop_owning=False"):
        EnvlinkSessionFactory("ws://127.0.0.1:9", capture_url="http://127.0.0.1:9",
                              sampling={"temperature": 1.0}, loop_owning=False)
    # With the policy, loop-owning capture is what it makes.
    factory = EnvlinkSessionFactory("ws://127.0.0.1:9", capture_url="http://127.0.0.1:9/",
                                    sampling={"temperature": 1.0})
    assert factory.loop_owning and factory.capture_url == "http://127.0.0.1:9"


def test_create_gives_up_at_its_deadline_without_spending_the_budget() -> None:
    """Against nothing listening, create's opening wait goes on until its deadline (a
    wait spends no retry budget), raises the typed error, and counts the failure."""
    budget = RetryBudget(max_tokens=2, token_ratio=0.01)
    factory = EnvlinkSessionFactory(
        "ws://127.0.0.1:9", create_timeout=1,
        reconnect=ReconnectPolicy(initial_delay=0.01, max_delay=0.05, budget=budget),
        client_options={"reconnect": ReconnectPolicy(max_attempts=1)})
    started = time.monotonic()
    with pytest.raises(ConnectError):
        factory.create("x")
    assert time.monotonic() - started >= 0.9
    assert budget.tokens == 2
    assert factory.failed == 1


async def test_acreate_does_not_block_the_loop(one_session_server: ServerProcess) -> None:
    """The async form awaits creation and tool calls on the caller's loop."""
    factory = EnvlinkSessionFactory(one_session_server.url, create_timeout=30)
    session = await factory.acreate("async")
    result = await session.acall_tool("echo_with_length", {"message": "abc"})
    assert result.data == {"message": "abc", "length": 3}
    await session.aclose()
    assert one_session_server.health()["sessions"] == 0


def test_loop_owning_create_retries_a_refusal_and_waits_for_capacity() -> None:
    """Loop-owning create on /harness: a refused upgrade is retried, a full server is waited
    for (the second run gets the slot once the first closes), and each run is a started
    harness run whose captures report the trainer's sampling."""
    with ServerThread(env="echo", ping_interval=None, max_sessions=1) as st:
        st.call(lambda s: setattr(s.faults, "refuse", 1))
        factory = EnvlinkSessionFactory(st.url, sampling={"temperature": 0.5},
                                        create_timeout=30)
        first = factory.create({"prompt": "one"})
        assert isinstance(first, EnvlinkHarnessSession)
        created: list[EnvlinkHarnessSession] = []
        waiter = threading.Thread(target=lambda: created.append(factory.create("two")))
        waiter.start()
        # The waiter's try reached the full server (and was refused): free the slot.
        st.call(lambda s: s._counters.wait("connection.opened", 2), timeout=30)
        assert first.wait_for_completion(30) == 0
        assert [t["metadata"]["sampling"] for t in first.training_turns()] == [
            {"temperature": 0.5}] * 2
        first.close()
        waiter.join(30)
        (second,) = created
        assert second.wait_for_completion(30) == 0
        assert second.verify([]).env_reward == 1.0
        second.close()
        seen = st.call(lambda s: s._counters.snapshot())
        assert seen["refused"] == 1
        assert (factory.created, factory.failed) == (2, 0)


@pytest.mark.parametrize(("content", "error"), [("!drop", ConnectionLostError),
                                                ("!fail", HarnessTurnError)])
def test_a_lost_or_failed_run_raises_from_wait(content: str, error: type[Exception]) -> None:
    """A harness run cut by a dropped connection, or ended by the agent's terminal error,
    raises its typed error from wait_for_completion (the trainer scores it unscorable);
    what was captured before stays readable, and close leaves nothing open."""
    with ServerThread(env="echo", ping_interval=None) as st:
        run = EnvlinkSessionFactory(st.url, loop_owning=True).create(content)
        with pytest.raises(error):
            run.wait_for_completion(30)
        assert run.training_turns() == []
        assert run.verify([]).env_reward is None
        run.close()
        st.call(lambda s: s._counters.wait("session.destroyed", 1), timeout=30)
        assert st.call(lambda s: len(s._registry)) == 0


def test_a_stuck_run_times_out_and_a_close_wakes_its_waiter() -> None:
    """A run that does not complete: wait_for_completion(timeout) raises a TimeoutError and
    the run goes on; close() from another thread (as TRL does on stop) wakes a waiter
    with ClientClosedError, never a bare cancellation; the session ends."""
    with ServerThread(env="echo", ping_interval=None) as st:
        run = EnvlinkSessionFactory(st.url, loop_owning=True).create("!hang")
        with pytest.raises(TimeoutError, match="did not complete"):
            run.wait_for_completion(0.2)
        assert [e.type.value for e in run.events] == ["llm_request"]
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                run.wait_for_completion()
            except BaseException as exc:  # reported below
                errors.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        run.close()
        waiter.join(30)
        assert len(errors) == 1 and isinstance(errors[0], ClientClosedError), errors
        st.call(lambda s: s._counters.wait("session.destroyed", 1), timeout=30)
        assert st.call(lambda s: len(s._registry)) == 0


def test_a_run_keeps_the_default_bridge_while_other_clients_come_and_go() -> None:
    """A loop-owning run holds a lease on the default bridge, as a facade does: the last
    other client closing does not end the loop thread under the run, and the run's close
    gives the lease back (no envlink thread is left once it held the last one)."""
    from envlink._sync import default_bridge as shared

    def leases() -> int:  # facades open on the current default bridge
        return shared._users if shared._bridge is not None else 0

    gc.collect()  # an earlier test's facade collected unclosed gives its lease back now
    before = leases()
    with ServerThread(env="echo", ping_interval=None) as st:
        run = EnvlinkSessionFactory(st.url, loop_owning=True).create("!hang")
        assert leases() == before + 1
        other = GenericEnvClient(st.url).sync()
        other.reset()
        other.close()  # before the fix, the default bridge's last lease: its thread ended
        assert not run._bridge.closed
        with pytest.raises(TimeoutError, match="did not complete"):
            run.wait_for_completion(0.2)
        run.close()
        assert leases() == before
        # The run held the last lease unless an earlier test's facade still holds one.
        assert run._bridge.closed is (before == 0)
        st.call(lambda s: s._counters.wait("session.destroyed", 1), timeout=30)
