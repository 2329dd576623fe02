"""TF Serving's REST API (aiohttp routes on the protocol-neutral host, `serving.http_calls`).

Routes: `GET /v1/models/{name}[/versions/{v}|/labels/{l}]` (status), `.../metadata`, and
`POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict` with `instances` (row) or `inputs`
(columnar) JSON, `{"b64": ...}` for binary strings; `:classify` / `:regress` with `examples` (and `context`)
of tf.Example features (`serving.tfs.examples`). Errors: `{"error": "..."}` with the error's
`http_status` (`serving.http_calls`). JSON values are converted to the signature's dtypes, as TF Serving does.
`serving.rest_port` composes these routes with the Open Inference Protocol's on one port.
"""

from __future__ import annotations

import logging
import re

from aiohttp import web
from google.protobuf import json_format

from tfship.core import protocol
from tfship.core.echo import clip, echo_json
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError
from tfship.serving.dataplane.admission import batched_inputs, rows_over_limit
from tfship.serving.dataplane.offload import Offloader
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import InferenceRequest, ModelMetadata, ModelRef
from tfship.serving.http_calls import error_response, expect_within_limit, read_body
from tfship.serving.tfs import converters, examples, json_write, rest_json

log = logging.getLogger(__name__)
_SPEC = r"{name:[^/:]+}{sel:(/versions/[0-9]+|/labels/[^/:]+)?}"  # ASCII digits only (not \d: "１")


def _ref(request: web.Request) -> ModelRef:
    name, sel = request.match_info["name"], request.match_info.get("sel") or ""
    if sel.startswith("/versions/"):
        return ModelRef(name, version=int(sel.rsplit("/", 1)[1]))
    if sel.startswith("/labels/"):
        return ModelRef(name, label=sel.rsplit("/", 1)[1])
    return ModelRef(name)


# TF Serving hands only paths matching kHTTPRestApiHandlerPathRegex `(?i)/v1/.*` (http_rest_api_util.h) to its REST
# handler; any other path gets libevent's own 404 page (evhttp_server.cc: evhttp_send_error(req, HTTP_NOTFOUND,
# nullptr), whose body is libevent's ERR_FORMAT page for "404 Not Found").
_TFS_PATHS = re.compile(r"(?i)/v1/.*")
_NOT_FOUND_PAGE = ("<HTML><HEAD>\n<TITLE>404 Not Found</TITLE>\n</HEAD><BODY>\n<H1>Not Found</H1>\n"
                   "</BODY></HTML>\n")


def unrouted_answer(request: web.Request, err: web.HTTPException, other_apis: tuple[str, ...] = ()) -> web.Response:
    """`http_calls.Unrouted` in TF Serving's shape: under `/v1/` (and under the path prefixes of `other_apis`
    sharing the port), no route / wrong method is 400 `Malformed request: GET /v1/foo` (http_rest_api_handler.cc
    ProcessRequest's default status); any other path is 404 with libevent's HTML page, as TF Serving answers it.
    """
    if err.status == 404 and not _TFS_PATHS.fullmatch(request.path) and not request.path.startswith(other_apis):
        return web.Response(text=_NOT_FOUND_PAGE, status=404, content_type="text/html")
    return error_response(f"Malformed request: {clip(request.method)} {clip(request.path)}", 400)


def _output_filter(body: dict) -> tuple[str, ...]:
    """`output_filter` as a tuple of names; a single string is a one-name list (a tfship extension)."""
    names = body.get("output_filter")
    if names is None:
        return ()
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidRequestError(f"'output_filter' must be a list of output names, got {echo_json(names, 100)}")
    return tuple(names)


def _json_text(payload: dict, max_bytes: int) -> str:
    """Serialise `payload` (NaN/Infinity as TF Serving writes them); refuse a body above `max_bytes`.

    Raises:
        ResourceExhaustedError: the JSON body is larger than --max-message-bytes (names both sizes).
    """
    text = json_write.dumps(payload)  # floats as TF Serving writes them (serving.tfs.json_write)
    if len(text) > max_bytes:
        raise ResourceExhaustedError(f"response of {len(text)} bytes (JSON) exceeds --max-message-bytes "
                                     f"{max_bytes}; ask for fewer rows or outputs (output_filter)")
    return text


def encode_predict(outputs: dict, rows: bool, batch: int | None, max_bytes: int) -> str:
    """A predict answer's JSON text (runs inline or in the helper process); raises as `_json_text`."""
    return _json_text(rest_json.response_json(outputs, rows, batch), max_bytes)


def _proto_json(message) -> dict:
    """A proto as TF Serving's REST handler prints it: proto field names, fields without presence included."""
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True,
                                     preserving_proto_field_name=True)


def decode_predict(raw: bytes, signatures: dict | None, max_rows: int = 0):
    """A `:predict` body -> (signature name, output_filter, inputs, row format?, batch); inputs are None when
    `signatures` is None (the model was not found). Runs inline or in the helper process (`serving.dataplane.offload`).

    `max_rows`: --max-batch-per-request (0 = unlimited), judged on the parsed lists' lengths before their values
    are converted (`serving.dataplane.admission`).

    Raises:
        InvalidRequestError: bad JSON, bad fields, an unknown signature, a batch above `max_rows` or inputs that
            do not convert.
    """
    body = rest_json.parse_body(raw)
    signature_name = rest_json.signature_name(body)
    output_filter = _output_filter(body)
    if signatures is None:
        return signature_name, output_filter, None, False, None
    if signature_name not in signatures:
        raise InvalidRequestError(f'Serving signature name: "{clip(signature_name)}" not found in signature def; '
                                  f"available: {sorted(signatures)}")
    rows = _listed_rows(body, signatures[signature_name])
    if max_rows and rows is not None and rows > max_rows:
        raise rows_over_limit(rows, max_rows)
    inputs, rows = rest_json.request_inputs(body, signatures[signature_name])
    return signature_name, output_filter, inputs, rows, len(body["instances"]) if rows else None


def _listed_rows(body: dict, signature) -> int | None:
    """The batch a parsed `:predict` body declares, from list lengths alone (None when it declares none): the
    `instances` count, or the length of the first batched input's list in `inputs` (a bare list when the
    signature's only input is batched). Malformed bodies give None here and their error later.
    """
    batched = batched_inputs(signature)
    if not batched:
        return None
    listed = body.get("instances", body.get("inputs"))
    if "instances" not in body:
        if isinstance(listed, dict):
            listed = next((listed[name] for name in batched if name in listed), None)
        elif len(signature.inputs) != 1:
            return None
    return len(listed) if isinstance(listed, list) else None


def artifact_json(artifact) -> dict[str, str]:
    """`/v1/models/M/metadata`'s `artifact` key (a tfship extension beside TF Serving's `model_spec` and
    `metadata`): the published artifact that answers, `{"name", "backend", "file", "sha256"}`.

    Args:
        artifact: `serving.runtimes.published.PublishedArtifact` (`tfship serve --artifact NAME`).
    """
    return {"name": artifact.name, "backend": artifact.backend, "file": artifact.file, "sha256": artifact.sha256}


class _TfsRoutes:
    """TF Serving's REST handlers over one data plane (see the module docstring)."""

    def __init__(self, dataplane: DataPlane, timeout_s: float, max_bytes: int, offloader: Offloader | None) -> None:
        self.dataplane, self.timeout_s, self.max_bytes = dataplane, timeout_s, max_bytes
        self.offloader = offloader or dataplane.offloader

    async def status(self, request: web.Request) -> web.Response:
        statuses = await self.dataplane.model_status(_ref(request))
        body = _proto_json(converters.status_response(statuses))
        for entry, status in zip(body.get("model_version_status", []), statuses, strict=True):
            if status.artifact is not None:  # `tfship serve --artifact`: a key TF Serving's clients do not read
                entry["artifact"] = artifact_json(status.artifact)
        return web.json_response(body)

    async def metadata(self, request: web.Request) -> web.Response:
        meta = await self.dataplane.metadata(_ref(request))
        proto = converters.metadata_response(meta)
        defs = protocol.SignatureDefMap()
        proto.metadata["signature_def"].Unpack(defs)
        body = {"model_spec": _proto_json(proto.model_spec), "metadata": {"signature_def": _proto_json(defs)}}
        if meta.artifact is not None:  # `tfship serve --artifact`: a key TF Serving's clients do not read
            body["artifact"] = artifact_json(meta.artifact)
        if meta.verification is not None:  # `--verify-key`: the verified version's record, an extra key
            body["verification"] = dict(meta.verification)
        return web.json_response(body)

    async def predict(self, request: web.Request) -> web.Response:
        raw = await read_body(request, self.timeout_s)
        ref, dataplane = _ref(request), self.dataplane
        answer_layout = {}  # how the JSON answer is laid out: row format? and the `instances` count

        async def decode(meta: ModelMetadata | None) -> InferenceRequest | None:
            signature_name, output_filter, inputs, rows, batch = await self.offloader.run_if_large(
                len(raw), decode_predict, raw, dict(meta.signatures) if meta else None,
                dataplane.limits.max_batch_per_request)
            answer_layout.update(rows=rows, batch=batch)
            return InferenceRequest(model=ref, inputs=inputs, signature_name=signature_name,
                                    output_filter=output_filter) if meta else None

        response = await dataplane.predict_decoded(ref, decode)  # one version: decoded against, run on
        rows, batch = answer_layout["rows"], answer_layout["batch"]
        outputs = dict(response.outputs)
        text = await self.offloader.run_if_large(sum(a.nbytes for a in outputs.values()) * 4,  # JSON: ~4x the bytes
                                                 encode_predict, outputs, rows, batch, self.max_bytes)
        return web.Response(text=text, content_type="application/json")

    async def classify_or_regress(self, request: web.Request) -> web.Response:
        body = rest_json.parse_body(await read_body(request, self.timeout_s))
        verb = request.match_info["verb"]
        inference = examples.rest_request(body, verb, _ref(request), rest_json.signature_name(body))
        answer = examples.rest_response(await self.dataplane.infer_examples(inference))
        return web.Response(text=_json_text(answer, self.max_bytes), content_type="application/json")


def add_tfs_routes(app: web.Application, dataplane: DataPlane, timeout_s: float = 30.0, max_bytes: int = 64 << 20,
                   offloader: Offloader | None = None) -> None:
    """Add TF Serving's REST routes over `dataplane` to `app` (a `serving.http_calls.new_app` host).

    A request body must arrive within `timeout_s` seconds (else HTTP 408); answers above `max_bytes` are refused
    RESOURCE_EXHAUSTED. Large bodies and answers are decoded / encoded by `offloader` (default: the data plane's
    helper process, `serving.dataplane.offload`), so they never stall the event loop.
    """
    routes = _TfsRoutes(dataplane, timeout_s, max_bytes, offloader)
    base = "/v1/models/" + _SPEC
    app.router.add_get("/v1/models", _missing_model_name)
    app.router.add_get(base, routes.status)
    app.router.add_get(base + "/metadata", routes.metadata)
    app.router.add_post(base + ":predict", routes.predict, expect_handler=expect_within_limit)
    app.router.add_post(base + ":{verb:classify|regress}", routes.classify_or_regress,
                        expect_handler=expect_within_limit)


async def _missing_model_name(request: web.Request) -> web.Response:
    """`GET /v1/models`: TF Serving's status regex matches it with an empty name (http_rest_api_handler.cc
    ProcessModelStatusRequest).
    """
    raise InvalidRequestError("Missing model name in request.")
