"""``envlink serve`` (envlink.server.main): flags, the listening line, signals."""

from __future__ import annotations

import signal

import pytest

from envlink.server._command import build_parser, main, options_from_args
from envlink.server._server import DEFAULT_MAX_MESSAGE_SIZE

from ._server_support import STATE, ServeProcess, open_ws, rpc

pytestmark = pytest.mark.timeout(20)


def test_defaults() -> None:
    """Without flags: loopback, echo, extensions on, no faults."""
    opts = options_from_args(build_parser().parse_args([]))
    faults = opts.pop("faults")
    assert opts == {
        "env": "echo", "host": "127.0.0.1", "port": 8000, "max_sessions": 64,
        "max_message_size": DEFAULT_MAX_MESSAGE_SIZE, "extensions": True,
        "resume_grace": 30.0, "session_store": None,
    }
    assert faults.latency == 0
    assert faults.drop_after is None
    assert faults.refuse == 0


def test_all_flags() -> None:
    """Every flag lands in the server options or its Faults."""
    argv = [
        "--host", "0.0.0.0", "--port", "0", "--env", "deterministic", "--max-sessions", "3",
        "--max-message-size", "2048", "--no-extensions", "--resume-grace", "1.5",
        "--session-store", "/tmp/x", "--latency", "0.25", "--drop-after", "4",
        "--drop-mode", "mid_answer", "--stall-after", "6", "--error-frames", "2",
        "--error-code", "SESSION_ERROR", "--corrupt-frames", "1", "--corrupt-kind", "array",
        "--refuse", "5", "--refuse-status", "429", "--retry-after", "2", "--refuse-for", "9",
    ]
    opts = options_from_args(build_parser().parse_args(argv))
    faults = opts.pop("faults")
    assert opts == {
        "env": "deterministic", "host": "0.0.0.0", "port": 0, "max_sessions": 3,
        "max_message_size": 2048, "extensions": False, "resume_grace": 1.5,
        "session_store": "/tmp/x",
    }
    assert (faults.latency, faults.drop_after, faults.drop_mode) == (0.25, 4, "mid_answer")
    assert faults.stall_after == 6
    assert (faults.error_frames, faults.error_code) == (2, "SESSION_ERROR")
    assert (faults.corrupt_frames, faults.corrupt_kind) == (1, "array")
    assert (faults.refuse, faults.refuse_status, faults.retry_after) == (5, 429, 2.0)
    assert faults.refuse_until is not None


@pytest.mark.parametrize("argv", [
    ["--drop-mode", "sideways"], ["--corrupt-kind", "weird"], ["--max-sessions", "0"],
    ["--latency", "-1"], ["--env", "nope"], ["--bogus"],
])
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Invalid flags are reported on stderr and main returns 2."""
    assert main(argv) == 2
    assert capsys.readouterr().err


def test_help_returns_0(capsys: pytest.CaptureFixture[str]) -> None:
    """--help prints usage and main returns 0."""
    assert main(["--help"]) == 0
    assert "envlink serve" in capsys.readouterr().out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_subprocess_serves_and_stops_on_signal(sig: signal.Signals) -> None:
    """The process prints exactly one listening line, serves, and exits 0 on SIGTERM/SIGINT."""
    with ServeProcess("--port", "0") as proc:
        assert proc.url.startswith("ws://127.0.0.1:")
        async with open_ws(proc) as ws:
            assert (await rpc(ws, STATE))["type"] == "state"
        proc.proc.send_signal(sig)
        out, _ = proc.proc.communicate(timeout=10)
        assert proc.proc.returncode == 0
        assert out == ""  # nothing after the listening line


async def test_subprocess_flags_take_effect() -> None:
    """Fault flags given on the command line are active in the served process."""
    with ServeProcess("--port", "0", "--error-frames", "1", "--error-code",
                      "CAPACITY_REACHED") as proc:
        async with open_ws(proc) as ws:
            assert (await rpc(ws, STATE))["data"]["code"] == "CAPACITY_REACHED"
            assert (await rpc(ws, STATE))["type"] == "state"


async def test_events_flag_announces_server_events() -> None:
    """--events prints one line per server event after the listening line, in order."""
    with ServeProcess("--port", "0", "--events") as proc:
        async with open_ws(proc) as ws:
            assert (await rpc(ws, STATE))["type"] == "state"
        proc.proc.send_signal(signal.SIGTERM)
        out, _ = proc.proc.communicate(timeout=10)
    events = [line.split()[3:] for line in out.splitlines()]
    assert all(line.startswith("envlink serve: event ") for line in out.splitlines())
    assert ["connection.opened", "1"] in events
    assert events.index(["request.state", "1"]) < events.index(["applied.state", "1"])


def test_envlink_command_dispatches_to_its_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    """`envlink` is one parser: version, help, serve and demo options, usage errors."""
    from envlink import __version__
    from envlink._cli.main import main as envlink_main

    assert envlink_main(["version"]) == 0
    assert envlink_main(["--version"]) == 0
    assert capsys.readouterr().out == f"envlink {__version__}\n" * 2
    assert envlink_main(["help"]) == 0
    assert "serve" in capsys.readouterr().out
    assert envlink_main([]) == 2  # no command: usage on stdout, as a usage error
    assert "usage: envlink" in capsys.readouterr().out
    assert envlink_main(["teleport"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert envlink_main(["serve", "--help"]) == 0
    assert "--drop-after" in capsys.readouterr().out
    assert envlink_main(["serve", "--max-sessions", "0"]) == 2
    assert envlink_main(["demo", "--steps", "0"]) == 2
    assert "envlink demo: error: --steps must be at least 1" in capsys.readouterr().err


def test_envlink_serve_and_python_m_server_share_their_options() -> None:
    """`envlink serve` and `python -m envlink.server` parse the same options the same way."""
    from envlink._cli.main import build_parser as envlink_parser

    argv = ["--port", "0", "--env", "deterministic", "--drop-after", "3", "--no-extensions"]
    top = vars(envlink_parser().parse_args(["serve", *argv]))
    alone = vars(build_parser().parse_args(argv))
    assert {k: top[k] for k in alone} == alone


def test_every_serve_option_has_help_text() -> None:
    """Each option of `envlink serve --help` says what it does (no bare flag left)."""
    parser = build_parser()
    bare = [action.option_strings for action in parser._actions
            if action.option_strings and not (action.help and action.help.strip())]
    assert bare == []
    # As printed: each option's entry carries words beyond its own invocation.
    entries: dict[str, str] = {}
    for line in parser.format_help().splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = line
        elif line.startswith("   ") and entries:
            entries[flag] += line
    for flag in ("--max-sessions", "--max-message-size", "--drop-mode", "--error-code",
                 "--corrupt-kind", "--refuse-status"):
        assert "(default:" in entries[flag], entries[flag]
