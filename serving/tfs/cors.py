"""TF Serving's `--rest_api_enable_cors_support`: CORS headers on every REST answer, and preflights answered.

As TF Serving's http_server.cc: every response (errors included) carries `Access-Control-Allow-Origin: *`,
`Access-Control-Allow-Methods: POST, GET` and `Access-Control-Allow-Headers: Content-Type`; an `OPTIONS`
preflight is answered 200 with an empty body when its `Origin` header names an http(s) origin, else 400
`Origin header is missing in CORS preflight`. Preflights carry no credentials, so they are answered before
the token check.
"""

from __future__ import annotations

import re

from aiohttp import web

CORS_HEADERS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "POST, GET",
                "Access-Control-Allow-Headers": "Content-Type"}
_ORIGIN = re.compile(r"https?://")


@web.middleware
async def cors_middleware(request: web.Request, handler):
    """The outermost REST middleware when CORS support is on (see the module docstring)."""
    if request.method == "OPTIONS":
        if _ORIGIN.search(request.headers.get("Origin", "")):
            response = web.Response(status=200)
        else:
            response = web.json_response({"error": "Origin header is missing in CORS preflight"}, status=400)
    else:
        response = await handler(request)
    response.headers.update(CORS_HEADERS)
    return response
