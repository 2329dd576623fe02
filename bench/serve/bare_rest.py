"""Bare aiohttp reference server: answers `POST /v1/models/<name>:predict` with a prebuilt JSON body.

No tfship code: the request body is read (as any handler must) but not parsed, the reply is the
bytes of `--response-file`. The REST floor of `make bench-serve`. Prints `READY <port>` when listening.

    python -m bench.serve.bare_rest --response-file RESP.json [--port 0] [--cpu 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from aiohttp import web


async def serve(reply: bytes, port: int) -> None:
    """Listen on 127.0.0.1:`port` (0 = any free port) until cancelled or SIGTERM."""

    async def predict(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=reply, content_type="application/json")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/models/{name}:predict", predict)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    sys.stdout.write(f"READY {runner.addresses[0][1]}\n")
    sys.stdout.flush()
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bench.serve.bare_rest")
    p.add_argument("--response-file", type=Path, required=True, help="JSON body to send")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--cpu", type=int, action="append", default=[], help="pin to these cores")
    args = p.parse_args(argv)
    if args.cpu:
        os.sched_setaffinity(0, set(args.cpu))
    asyncio.run(serve(args.response_file.read_bytes(), args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
