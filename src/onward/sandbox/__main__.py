"""``python -m onward.sandbox --host 127.0.0.1 --port 8099``: serve the provider sandbox."""

from __future__ import annotations

import argparse

from onward.sandbox.server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m onward.sandbox",
        description="Serve fake email/CRM/model/payment/Slack providers with fault knobs.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument(
        "--fd", type=int, default=None, help="serve on this inherited listening socket instead"
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="exit when stdin reaches EOF (used by SandboxServer)",
    )
    args = parser.parse_args(argv)
    serve(
        args.host,
        args.port,
        fd=args.fd,
        log_level=args.log_level,
        exit_with_parent=args.exit_with_parent,
    )


if __name__ == "__main__":
    main()
