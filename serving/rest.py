"""REST transport (aiohttp), TF Serving's REST API, plus the Prometheus metrics endpoint.

Routes: `GET /v1/models/{name}[/versions/{v}|/labels/{l}]` (status), `.../metadata`, and
`POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict` with `instances` (row) or `inputs`
(columnar) JSON, `{"b64": ...}` for binary strings. Errors: `{"error": "..."}` with the error's
`http_status`. JSON values are converted to the signature's dtypes, as TF Serving does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import uuid

import numpy as np
from aiohttp import web
from google.protobuf import json_format

from core.errors import InvalidRequestError, TfshipError
from core import protocol
from serving import converters
from core.contract import Signature
from serving.dataplane import DataPlane
from serving.metrics import CONTENT_TYPE, Metrics
from serving.security import AccessPolicy
from serving.types import InferenceRequest, ModelRef

log = logging.getLogger(__name__)
PROMETHEUS_PATH = "/monitoring/prometheus/metrics"  # TF Serving's path (--monitoring_config_file)
_SPEC = r"{name:[^/:]+}{sel:(/versions/\d+|/labels/[^/:]+)?}"


def _ref(request: web.Request) -> ModelRef:
    name, sel = request.match_info["name"], request.match_info.get("sel") or ""
    if sel.startswith("/versions/"):
        return ModelRef(name, version=int(sel.rsplit("/", 1)[1]))
    if sel.startswith("/labels/"):
        return ModelRef(name, label=sel.rsplit("/", 1)[1])
    return ModelRef(name)


def _error_middleware(policy: AccessPolicy):
    @web.middleware
    async def middleware(request: web.Request, handler):
        try:
            policy.check(request.headers.get("Authorization", ""))
            return await handler(request)
        except web.HTTPException as err:
            return web.json_response({"error": err.reason}, status=err.status)
        except TfshipError as err:
            return web.json_response({"error": str(err)}, status=err.http_status)
        except Exception:
            incident = uuid.uuid4().hex[:12]
            log.exception("unexpected REST error (incident %s)", incident)
            return web.json_response({"error": f"internal server error (incident {incident})"}, status=500)

    return middleware


def _decode(value, dtype: str):
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_decode(v, dtype) for v in value]
    if dtype == "string" and isinstance(value, str):
        return value.encode()
    return value


def _array(key: str, value, signature: Signature) -> np.ndarray:
    spec = signature.inputs.get(key)
    if spec is None:  # validation names it as an unexpected input; its value is never decoded
        return np.empty(0)
    try:
        decoded = _decode(value, spec.dtype)
        return np.array(decoded, dtype=object if spec.dtype == "string" else spec.dtype)
    except (TypeError, ValueError, OverflowError) as err:
        raise InvalidRequestError(f"input {key!r}: cannot convert JSON value to {spec.describe()}: {err}") from err


def _inputs(body: dict, signature: Signature) -> tuple[dict[str, np.ndarray], bool]:
    """Arrays from a predict body and whether it used the row (`instances`) format."""
    if ("instances" in body) == ("inputs" in body):
        raise InvalidRequestError("request body needs exactly one of 'instances' (row) or 'inputs' (columnar)")
    single = next(iter(signature.inputs)) if len(signature.inputs) == 1 else None
    if "inputs" in body:
        data = body["inputs"]
        if not isinstance(data, dict) or set(data) == {"b64"}:  # one input's value, not a map of named inputs
            if single is None:
                raise InvalidRequestError(f"signature {signature.name!r} has inputs {sorted(signature.inputs)}: "
                                          "'inputs' must be an object naming them")
            data = {single: data}
        return {k: _array(k, v, signature) for k, v in data.items()}, False
    rows = body["instances"]
    if not isinstance(rows, list) or not rows:
        raise InvalidRequestError("'instances' must be a non-empty list of rows")
    if all(isinstance(r, dict) and "b64" not in r for r in rows):
        keys = set(rows[0])
        if any(set(r) != keys for r in rows):
            raise InvalidRequestError("every instance must name the same inputs")
        return {k: _array(k, [r[k] for r in rows], signature) for k in keys}, True
    if single is None:
        raise InvalidRequestError(f"signature {signature.name!r} has inputs {sorted(signature.inputs)}: "
                                  "each instance must be an object naming them")
    return {single: _array(single, rows, signature)}, True


def _signature_name(body: dict) -> str:
    name = body.get("signature_name") or "serving_default"
    if not isinstance(name, str):
        raise InvalidRequestError(f"'signature_name' must be a string, got {json.dumps(name)[:100]}")
    return name


def _output_filter(body: dict) -> tuple[str, ...]:
    """`output_filter` as a tuple of names; a single string is a one-name list."""
    names = body.get("output_filter")
    if names is None:
        return ()
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidRequestError(f"'output_filter' must be a list of output names, got {json.dumps(names)[:100]}")
    return tuple(names)


def _jsonable(array):
    if isinstance(array, np.generic):
        return _bytes_json(array.item())
    if not isinstance(array, np.ndarray):
        return _bytes_json(array)
    if array.dtype == object:
        return [_jsonable(a) for a in array] if array.ndim else _bytes_json(array.item())
    return array.tolist()


def _bytes_json(value):
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode()}
    return value


def _outputs(outputs: dict[str, np.ndarray], rows: bool) -> dict:
    if not rows:
        if len(outputs) == 1:
            return {"outputs": _jsonable(next(iter(outputs.values())))}
        return {"outputs": {k: _jsonable(v) for k, v in outputs.items()}}
    if len(outputs) == 1:
        return {"predictions": _jsonable(next(iter(outputs.values())))}
    n = len(next(iter(outputs.values())))
    return {"predictions": [{k: _jsonable(v[i]) for k, v in outputs.items()} for i in range(n)]}


def build_app(dataplane: DataPlane, policy: AccessPolicy = AccessPolicy(), max_bytes: int = 64 << 20,
              metrics: Metrics | None = None) -> web.Application:
    """The TF Serving REST API over `dataplane`, under `policy` (bearer tokens; default open).

    With `metrics`, Prometheus text is also served at TF Serving's `/monitoring/prometheus/metrics`.
    """

    async def status(request: web.Request) -> web.Response:
        statuses = await dataplane.model_status(_ref(request))
        proto = converters.status_response(statuses)
        return web.json_response(json_format.MessageToDict(proto, always_print_fields_with_no_presence=True))

    async def metadata(request: web.Request) -> web.Response:
        meta = await dataplane.metadata(_ref(request))
        proto = converters.metadata_response(meta)
        defs = protocol.SignatureDefMap()
        proto.metadata["signature_def"].Unpack(defs)
        return web.json_response({
            "model_spec": {"name": meta.model_name, "signature_name": "", "version": str(meta.version)},
            "metadata": {"signature_def": json_format.MessageToDict(defs)},
        })

    async def predict(request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError as err:
            raise InvalidRequestError(f"request body is not JSON: {err}") from err
        except RecursionError as err:
            raise InvalidRequestError("request body JSON is nested too deeply") from err
        if not isinstance(body, dict):
            raise InvalidRequestError("request body must be a JSON object")
        ref = _ref(request)
        signature_name, output_filter = _signature_name(body), _output_filter(body)
        meta = await dataplane.metadata(ref)
        if signature_name not in meta.signatures:
            raise InvalidRequestError(f"Serving signature name: {signature_name!r} not found in signature def; "
                                      f"available: {sorted(meta.signatures)}")
        try:
            inputs, rows = _inputs(body, meta.signatures[signature_name])
        except RecursionError as err:
            raise InvalidRequestError("input values are nested too deeply") from err
        response = await dataplane.predict(InferenceRequest(
            model=ModelRef(ref.name, version=meta.version), inputs=inputs, signature_name=signature_name,
            output_filter=output_filter))
        return web.json_response(_outputs(dict(response.outputs), rows))

    async def unimplemented(request: web.Request) -> web.Response:
        await dataplane.unimplemented(request.match_info["verb"].capitalize())

    app = web.Application(middlewares=[_error_middleware(policy)], client_max_size=max_bytes)
    if metrics is not None:
        app.router.add_get(PROMETHEUS_PATH, _metrics_handler(metrics))
    base = "/v1/models/" + _SPEC
    app.router.add_get(base, status)
    app.router.add_get(base + "/metadata", metadata)
    app.router.add_post(base + ":predict", predict)
    app.router.add_post(base + ":{verb:classify|regress}", unimplemented)
    return app


def _metrics_handler(metrics: Metrics):
    async def handler(request: web.Request) -> web.Response:
        body = await asyncio.to_thread(metrics.render)  # large registries never stall the event loop
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    return handler


async def _start(app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None,
                 reuse_port: bool = False) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_port=reuse_port or None)
    await site.start()
    return runner, runner.addresses[0][1]


async def start_rest(dataplane: DataPlane, settings, policy: AccessPolicy, metrics: Metrics,
                     ssl_context: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:
    """Start the REST API on `settings.host:settings.rest_port` (0 = any free), HTTPS when `ssl_context` is
    given, under `policy`; returns (runner, bound port)."""
    app = build_app(dataplane, policy, settings.max_message_bytes, metrics)
    return await _start(app, settings.host, settings.rest_port, ssl_context, settings.reuse_port)


async def start_metrics(metrics: Metrics, settings, policy: AccessPolicy,
                        ssl_context: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:
    """Serve Prometheus text at `/metrics` and `/monitoring/prometheus/metrics` on `settings.metrics_port`, under
    the same TLS and token policy as the other ports; returns (runner, bound port)."""
    app = web.Application(middlewares=[_error_middleware(policy)])
    app.router.add_get("/metrics", _metrics_handler(metrics))
    app.router.add_get(PROMETHEUS_PATH, _metrics_handler(metrics))
    return await _start(app, settings.host, settings.metrics_port, ssl_context, settings.reuse_port)
