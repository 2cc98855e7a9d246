"""Serve an environment package's own server, as ``openenv init`` lays one out.

Imports ``PACKAGE.server.app`` from ``--package-dir`` and serves its environment
with OpenEnv's ``create_app`` (the action and observation classes the package's app
module imports), under the interop harness: a loopback port, the readiness line,
the session limit and the frame log of every interop server.

Usage (with the openenv virtualenv's python)::

    python tests/interop/servers/package_server.py --package-dir DIR --package NAME --port 0
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from _harness import concurrency, parse_args, serve
from openenv.core.env_server import Action, Environment, Observation, create_app


def _one(module: Any, base: type) -> type:
    found = {value for value in vars(module).values()
             if isinstance(value, type) and issubclass(value, base) and value is not base}
    if len(found) != 1:
        raise SystemExit(f"expected one {base.__name__} in {module.__name__}, got {found}")
    return found.pop()


def main() -> None:
    args = parse_args(__doc__ or "", lambda parser: (
        parser.add_argument("--package-dir", required=True),
        parser.add_argument("--package", required=True)))
    sys.path.insert(0, args.package_dir)
    app_module = importlib.import_module(f"{args.package}.server.app")
    app = create_app(_one(app_module, Environment), _one(app_module, Action),
                     _one(app_module, Observation), env_name=args.package,
                     **concurrency(args))
    serve(app, args)


if __name__ == "__main__":
    main()
