"""Bare aiohttp reference server: answers `POST /v1/models/<name>:predict` with a prebuilt JSON body.

No tfship code: the request body is read (as any handler must) but not parsed, the reply is the
bytes of `--response-file`. The REST floor of `make bench-serve`. Prints `READY <port>` when listening.

    python -m bench.serve.bare_rest --response-file RESP.json [--port 0] [--cpu 0]
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from bench.serve.reference_cli import parse_reference_args, serve_rest


async def serve(reply: bytes, port: int) -> None:
    """Listen on 127.0.0.1:`port` (0 = any free port) until cancelled or SIGTERM."""

    async def predict(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=reply, content_type="application/json")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/models/{name}:predict", predict)
    await serve_rest(app, port)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    source, port = parse_reference_args("python -m bench.serve.bare_rest", "--response-file", "JSON body to send", argv)
    asyncio.run(serve(source.read_bytes(), port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
