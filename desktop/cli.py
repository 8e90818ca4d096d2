"""`r1desk-cli`: model_loader's commands (model_loader/cli.py) and `serve`, the local API server without a window:
the app's own EngineService and ApiServer on Qt's event loop (desktop/serve.py), so it lives on this side."""

from __future__ import annotations

import sys

from model_loader.cli import TEMPERATURE, TOP_P, _add_model_args, _count, _port, api_key_of
from model_loader.cli import main as model_loader_main


def add_serve(sub) -> None:
    serve = sub.add_parser("serve", help="serve the model through a local OpenAI-compatible API")
    _add_model_args(serve)
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this computer only); another needs --api-key",
    )
    serve.add_argument("--port", type=_port, default=8089, help="port; 0 picks a free one (default 8089)")
    serve.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 requests (other users can read a command "
        "line: prefer --api-key-file or R1DESK_API_KEY)",
    )
    serve.add_argument(
        "--api-key-file", default=None, metavar="FILE", help="read the API key from FILE (its first line)"
    )
    serve.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the model ids clients use (several allowed; default: the model folder's name)",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page origin allowed to call the API from a browser (CORS), e.g. "
        "http://localhost:3000; repeatable; none by default",
    )
    serve.add_argument("--max-waiting", type=_count(1), default=16, help="requests that may wait; more get 429")
    serve.add_argument(
        "--max-parallel",
        type=_parallel,
        default=0,
        metavar="N|auto",
        help="replies decoded together (continuous batching over a paged KV cache sized from the free memory); "
        "auto (default): as many as the free GPU memory holds at the whole context, up to 16; "
        "1: one at a time, the fastest single reply",
    )
    serve.add_argument(
        "--max-tokens-cap",
        type=_count(1),
        default=None,
        metavar="N",
        help="the most new tokens any request may have (default: up to the context)",
    )
    serve.add_argument("--temperature", type=TEMPERATURE, default=0.6, help="for requests that leave it out")
    serve.add_argument("--top-p", type=TOP_P, default=0.95, help="for requests that leave it out")
    serve.set_defaults(func=cmd_serve)


def _parallel(value: str) -> int:
    """--max-parallel: a count, or auto (0: the worker sizes it from the free memory)."""
    return 0 if value.strip().lower() == "auto" else _count(1)(value)


def cmd_serve(args) -> int:
    from desktop.serve import run

    try:
        args.api_key = api_key_of(args)
    except ValueError as err:
        print(f"r1desk serve: {err}", file=sys.stderr)
        return 2
    return run(args)


def main(argv: list[str] | None = None) -> int:
    return model_loader_main(argv, add_serve)


if __name__ == "__main__":
    sys.exit(main())
