"""The ``envlink`` command: ``envlink serve`` and ``envlink demo``."""

from __future__ import annotations

import sys

__all__ = ["main"]

_USAGE = """usage: envlink {serve,demo,version} [options]

  serve     run the reference OpenEnv-compatible server (envlink serve --help)
  demo      start the reference server on a free loopback port and run a traced
            episode against it through the sync facade (envlink demo --help)
  version   print envlink's version
"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``envlink`` console script.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The process exit status.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(_USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        from envlink.server import main as serve_main

        return serve_main(rest)
    if command == "demo":
        from envlink._demo import run_demo

        return run_demo(rest)
    if command in ("version", "--version"):
        from envlink import __version__

        sys.stdout.write(f"envlink {__version__}\n")
        return 0
    sys.stderr.write(f"envlink: unknown command {command!r}\n{_USAGE}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
