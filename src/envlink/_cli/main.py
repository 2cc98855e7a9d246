"""The ``envlink`` command: ``serve``, ``demo``, ``probe``, ``replay``, ``rollouts``, ``fleet``,
``version``.

One :mod:`argparse` parser with a subcommand each; the subcommands' options are
defined next to what they run (:mod:`envlink.server._command`, :mod:`envlink._cli.demo`,
:mod:`envlink._cli.probe`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from envlink import __version__
from envlink._cli.demo import DESCRIPTION as DEMO_DESCRIPTION
from envlink._cli.demo import add_arguments as add_demo_arguments
from envlink._cli.demo import demo_from_args
from envlink._cli.fleet_status import DESCRIPTION as FLEET_DESCRIPTION
from envlink._cli.fleet_status import add_arguments as add_fleet_arguments
from envlink._cli.fleet_status import fleet_from_args
from envlink._cli.probe import DESCRIPTION as PROBE_DESCRIPTION
from envlink._cli.probe import EPILOG as PROBE_EPILOG
from envlink._cli.probe import add_arguments as add_probe_arguments
from envlink._cli.probe import probe_from_args
from envlink._cli.rerun import DESCRIPTION as REPLAY_DESCRIPTION
from envlink._cli.rerun import add_arguments as add_replay_arguments
from envlink._cli.rerun import replay_from_args
from envlink._cli.rollout_summary import DESCRIPTION as ROLLOUTS_DESCRIPTION
from envlink._cli.rollout_summary import add_arguments as add_rollouts_arguments
from envlink._cli.rollout_summary import rollouts_from_args
from envlink.server._command import DESCRIPTION as SERVE_DESCRIPTION
from envlink.server._command import add_arguments as add_serve_arguments
from envlink.server._command import serve_from_args

__all__ = ["build_parser", "main"]

#: A subcommand: run with the parsed arguments and its own parser (for usage errors).
Command = Callable[[argparse.Namespace, argparse.ArgumentParser], int]


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``envlink`` command, with one subparser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="envlink", description="envlink: a hardened, traced client SDK for "
                                    "OpenEnv-compatible environment servers.")
    parser.add_argument("--version", action="version", version=f"envlink {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", description=SERVE_DESCRIPTION,
        help="run the reference OpenEnv-compatible server (envlink serve --help)")
    add_serve_arguments(serve)
    serve.set_defaults(run=_serve, parser=serve)
    demo = commands.add_parser(
        "demo", description=DEMO_DESCRIPTION,
        help="start the reference server on a free loopback port and run a traced "
             "episode against it through the sync facade (envlink demo --help)")
    add_demo_arguments(demo)
    demo.set_defaults(run=demo_from_args, parser=demo)
    probe = commands.add_parser(
        "probe", description=PROBE_DESCRIPTION, epilog=PROBE_EPILOG,
        help="look at a server: health, protocol, recovery, capacity, schema, tools, "
             "latency (envlink probe --help)")
    add_probe_arguments(probe)
    probe.set_defaults(run=probe_from_args, parser=probe)
    replay = commands.add_parser(
        "replay", description=REPLAY_DESCRIPTION,
        help="re-run recorded episodes against a server and compare every answer "
             "(envlink replay --help)")
    add_replay_arguments(replay)
    replay.set_defaults(run=replay_from_args, parser=replay)
    rollouts = commands.add_parser(
        "rollouts", description=ROLLOUTS_DESCRIPTION,
        help="summarise recorded episodes (envlink rollouts --help)")
    add_rollouts_arguments(rollouts)
    rollouts.set_defaults(run=rollouts_from_args, parser=rollouts)
    fleet = commands.add_parser(
        "fleet", description=FLEET_DESCRIPTION,
        help="look at the store of a fleet's shared limits: holders, waiters, limits "
             "(envlink fleet status --help)")
    add_fleet_arguments(fleet)
    fleet.set_defaults(run=fleet_from_args, parser=fleet)
    version = commands.add_parser("version", help="print envlink's version")
    version.set_defaults(run=_version, parser=version)
    help_ = commands.add_parser("help", help="print this help")
    help_.set_defaults(run=_help, parser=parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``envlink`` console script.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The process exit status: 0 on success (and for ``--help``), 2 on a usage
        error, else what the subcommand returns.
    """
    parser = build_parser()
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(args_list)
        if args.command is None:  # no subcommand: usage, as a usage error
            parser.print_help(sys.stdout)
            return 2
        run: Command = args.run
        return run(args, args.parser)
    except SystemExit as exc:  # --help, --version, or a usage error reported on stderr
        return exc.code if isinstance(exc.code, int) else 2


def _serve(args: argparse.Namespace, _parser: argparse.ArgumentParser) -> int:
    return serve_from_args(args)


def _version(_args: argparse.Namespace, _parser: argparse.ArgumentParser) -> int:
    sys.stdout.write(f"envlink {__version__}\n")
    return 0


def _help(_args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
