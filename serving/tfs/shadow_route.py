"""`GET /v1/shadow/<model>` on the REST port: the model's shadow report as JSON (`serving.dataplane.shadow`).

Under the REST port's access policy (inference tokens), like every other route there. With `--num-processes`
the answering worker merges every worker's part, so each call gets the one report whichever worker answers.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from tfship.core.echo import clip
from tfship.core.errors import ModelNotFoundError

SHADOW_PATH = "/v1/shadow/{model}"


def add_shadow_routes(app: web.Application, dataplane) -> None:
    """Add `GET /v1/shadow/{model}` reading `dataplane.shadow` (None: every model answers 404)."""

    async def report(request: web.Request) -> web.Response:
        model = request.match_info["model"]
        shadows = dataplane.shadow
        if shadows is None or model not in shadows.reports:
            served = sorted(shadows.reports) if shadows is not None else []
            raise ModelNotFoundError(f"model {clip(model)} has no shadow on this server; shadowed: {served} "
                                     "(serve with --shadow MODEL=VERSION_OR_LABEL)")
        payload = await asyncio.to_thread(shadows.report, model)  # reads the other workers' files
        return web.json_response(payload)

    app.router.add_get(SHADOW_PATH, report)
