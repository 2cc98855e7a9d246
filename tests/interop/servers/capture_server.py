"""OpenEnv 0.10's capture proxy (``openenv.core.harness.capture.CaptureServer``) on 127.0.0.1.

The proxy is OpenEnv's own: a ``CaptureServer`` built with the inference engine's URL,
its ASGI app served by :func:`_harness.serve` (``CaptureServer.start`` binds every
interface on a fixed port; the tests bind the loopback interface on a free one).

Usage (with the openenv virtualenv's python)::

    python tests/interop/servers/capture_server.py --port 0 --llm-url URL [--model M]
"""

from __future__ import annotations

import argparse

from _harness import parse_args, serve
from openenv.core.harness.capture import CaptureServer


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--llm-url", required=True, help="the OpenAI-compatible engine")
    parser.add_argument("--model", default="scripted", help="the engine's served model")
    parser.add_argument("--admin-key", default=None, help="the proxy's admin key")


def main() -> None:
    args = parse_args(__doc__ or "", configure)
    capture = CaptureServer(llm_url=args.llm_url, model=args.model, port=0,
                            admin_key=args.admin_key)
    serve(capture.app, args)


if __name__ == "__main__":
    main()
