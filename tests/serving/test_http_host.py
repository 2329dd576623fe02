"""The protocol-neutral REST host (`serving.http_calls`) on its own, with a route of neither API: the one error
middleware answers a `TfshipError` with its HTTP status, anything else 500 with an incident id, a path no route
takes as the composer's `Unrouted` says, a body above the limit 413 naming both sizes, and a missing token 401
before any handler runs. Real aiohttp server on a free loopback port.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tfship.core.errors import InvalidRequestError
from tfship.serving.http_calls import error_response, new_app, read_body
from tfship.serving.operations.security import AccessPolicy

CALLED = web.AppKey("called", list)


def _app(policy: AccessPolicy | None = None, unrouted=None) -> web.Application:
    app = new_app(policy=policy, max_bytes=1024, **({"unrouted": unrouted} if unrouted else {}))
    app[CALLED] = []

    async def echo(request: web.Request) -> web.Response:
        request.app[CALLED].append(request.path)
        body = await read_body(request, timeout_s=5)
        if body == b"bad":
            raise InvalidRequestError("the body says bad")
        if body == b"bug":
            raise RuntimeError("a bug")
        return web.json_response({"bytes": len(body)})

    app.router.add_post("/plain/echo", echo)
    return app


async def _call(app: web.Application, method: str, path: str, body: bytes = b"", headers=None):
    async with TestClient(TestServer(app, host="127.0.0.1")) as http:
        answer = await http.request(method, path, data=body, headers=headers or {})
        return answer.status, await answer.text()


def test_errors_are_answered_by_the_one_middleware() -> None:
    async def run():
        assert await _call(_app(), "POST", "/plain/echo", b"abc") == (200, '{"bytes": 3}')
        status, text = await _call(_app(), "POST", "/plain/echo", b"bad")
        assert (status, json.loads(text)) == (400, {"error": "the body says bad"})
        status, text = await _call(_app(), "POST", "/plain/echo", b"bug")
        assert status == 500 and json.loads(text)["error"].startswith("internal server error (incident ")
        assert "a bug" not in text  # the detail is logged, never sent
        status, text = await _call(_app(), "POST", "/plain/echo", b"x" * 2048)
        assert (status, json.loads(text)) == (413, {"error": "request body of 2048 bytes exceeds "
                                                             "--max-message-bytes 1024 bytes"})

    asyncio.run(run())


def test_unrouted_paths_follow_the_composer() -> None:
    async def run():
        status, text = await _call(_app(), "GET", "/nowhere")
        assert (status, json.loads(text)) == (404, {"error": "no route: GET /nowhere"})
        status, text = await _call(_app(), "GET", "/plain/echo")  # wrong method: aiohttp's 405
        assert (status, json.loads(text)) == (405, {"error": "no route: GET /plain/echo"})
        teapot = _app(unrouted=lambda request, err: error_response(f"not here: {request.path}", 418))
        status, text = await _call(teapot, "GET", "/nowhere")
        assert (status, json.loads(text)) == (418, {"error": "not here: /nowhere"})

    asyncio.run(run())


def test_token_is_checked_before_the_handler() -> None:
    async def run():
        app = _app(AccessPolicy(inference_tokens=frozenset({"s3cret"})))
        status, _ = await _call(app, "POST", "/plain/echo", b"abc")
        assert status == 401 and app[CALLED] == []
        status, _ = await _call(app, "POST", "/plain/echo", b"abc", {"Authorization": "Bearer s3cret"})
        assert status == 200 and app[CALLED] == ["/plain/echo"]

    asyncio.run(run())
