"""REST transport for the Open Inference Protocol (KServe V2) under `/v2`, on the TF Serving REST port.

Routes (added to the protocol-neutral host, `serving.http_calls`, which `serving.rest_port` shares with TF
Serving's `/v1` routes, so the same middleware answers errors as `{"error": "..."}` with the error's HTTP status,
and the same auth, TLS and body-size limit apply):

  GET  /v2/health/live                                  200 {"live": true}
  GET  /v2/health/ready                                 200 {"ready": true} | 503 {"ready": false}
  GET  /v2                                              server metadata
  GET  /v2/models/{name}[/versions/{version}]           model metadata
  GET  /v2/models/{name}[/versions/{version}]/ready     200 {"name", "ready": true} | 503 ... false | 404
  GET  /v2/models/{name}[/versions/{version}]/config    Triton's model configuration (tfship's subset)
  POST /v2/models/{name}[/versions/{version}]/infer     inference

Inference bodies are JSON (`inputs` with `name`, `shape`, `datatype` and `data` flat or nested), or
Triton's binary tensor extension: the header `Inference-Header-Content-Length: N` says the first N bytes
are the JSON, and each input with `parameters.binary_data_size` takes its raw bytes, in input order, from
what follows. Outputs requested with `parameters.binary_data: true` (or all, with the request parameter
`binary_data_output: true`) come back the same way, with `parameters.binary_data_size`. gzip/deflate
request bodies (`Content-Encoding`) are accepted and responses compressed when `Accept-Encoding` asks.
"""

from __future__ import annotations

import json

import numpy as np
from aiohttp import web
from aiohttp.web_response import ContentCoding

from tfship.core.contract import DEFAULT_SIGNATURE
from tfship.core.echo import echo, echo_json, json_kind
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane import json_numbers
from tfship.serving.dataplane.admission import check_declared
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import InferenceRequest, ModelMetadata, ModelRef
from tfship.serving.http_calls import expect_within_limit, read_body
from tfship.serving.kserve.codec import datatype_for, from_json, from_raw, to_json, to_raw
from tfship.serving.kserve.converters import (
    EXTENSIONS,
    SERVER_NAME,
    artifact_parameters,
    check_inputs,
    check_outputs,
    check_response_size,
    infer_options,
    model_config,
    model_info,
    model_ref,
    ordered_outputs,
    predict_request,
    server_version,
    signature_of,
    verification_parameters,
)

HEADER_LENGTH = "Inference-Header-Content-Length"
V2_PREFIX = "/v2/"  # the paths this API owns on the shared REST port
_MODEL = r"/v2/models/{name}{sel:(/versions/[^/]+)?}"


def _ref(request: web.Request) -> ModelRef:
    sel = request.match_info.get("sel") or ""
    return model_ref(request.match_info["name"], sel[len("/versions/"):] if sel else "")


def _object(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be a JSON object, got {json_kind(value)}")
    return value


def _list(value, what: str) -> list:
    if not isinstance(value, list):
        raise InvalidRequestError(f"{what} must be a JSON array, got {json_kind(value)}")
    return value


def _split_body(header: str | None, body: bytes) -> tuple[dict, bytes]:
    """The JSON header and the binary section after it (Triton's binary tensor extension); `header`: the
    request's Inference-Header-Content-Length, if any.
    """
    length = len(body)
    if header is not None:
        if not header.isascii() or not header.isdigit() or int(header) > len(body):
            raise InvalidRequestError(f"{HEADER_LENGTH} must be an integer in [0, {len(body)}] (the body's size), "
                                      f"got {header[:40]!r}")
        length = int(header)
    try:
        parsed = json_numbers.loads_exact(body[:length])  # literals beyond float64 marked (refused for float inputs)
    except json_numbers.PARSE_ERRORS as err:
        raise InvalidRequestError(f"inference request JSON does not parse: {json_numbers.parse_error_reason(err)}"
                                  ) from None
    return _object(parsed, "the inference request"), body[length:]


def _decode_inputs(items: list, binary: bytes, max_bytes: int) -> list:
    """(name, datatype, array) per request input, from JSON `data` or the binary section."""
    decoded, offset = [], 0
    for index, item in enumerate(items):
        item = _object(item, f"inputs[{index}]")
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise InvalidRequestError(f"inputs[{index}] needs a string 'name' and 'datatype'")
        if not isinstance(shape, list) or not all(type(d) is int for d in shape):
            raise InvalidRequestError(f"input {echo(name)}: 'shape' must be a JSON array of integers, got "
                                      f"{echo_json(shape, 100)}")
        size = _object(item.get("parameters", {}), f"input {echo(name)} parameters").get("binary_data_size")
        if size is None:
            if "data" not in item:
                raise InvalidRequestError(f"input {echo(name)} needs 'data' or parameters.binary_data_size")
            decoded.append((name, datatype, from_json(name, datatype, shape, item["data"], max_bytes)))
            continue
        if type(size) is not int or size < 0 or offset + size > len(binary):
            raise InvalidRequestError(f"input {echo(name)}: binary_data_size {echo_json(size, 40)} does not fit the "
                                      f"{len(binary) - offset} bytes of binary data left")
        if "data" in item:  # which one holds the values? (the binary part used to win silently)
            raise InvalidRequestError(f"input {echo(name)} has both 'data' and parameters.binary_data_size; send "
                                      "its values in one of them")
        decoded.append((name, datatype, from_raw(name, datatype, shape, binary[offset:offset + size], max_bytes)))
        offset += size
    if offset != len(binary):
        raise InvalidRequestError(f"{len(binary) - offset} bytes of binary data follow the inputs' "
                                  "binary_data_size; check Inference-Header-Content-Length")
    return decoded


def slow_bytes_of(header: str | None, body: bytes) -> int:
    """How many bytes of a V2 REST `body` cost per-value Python work to decode, for the offloader to judge: the
    JSON header (Inference-Header-Content-Length, when it is a valid length) when the binary part after it holds
    numbers only (taken as views), else the whole body (binary BYTES are split in a Python loop; a header with a
    JSON escape might spell BYTES). A 12 MB body of a 150-byte header and binary numbers went to the helpers'
    large lane by its total size, where another client's 60 MB JSON bodies had it refused RESOURCE_EXHAUSTED.
    """
    if header is None or not header.isascii() or not header.isdigit() or int(header) > len(body):
        return len(body)
    json_part = body[:int(header)]
    return len(body) if b"BYTES" in json_part or b"\\" in json_part else len(json_part)


def decode_body(header: str | None, body: bytes, max_bytes: int, signatures: dict | None = None,
                max_rows: int = 0, memory_cap: int = 0) -> tuple[dict, list]:
    """Parse a V2 REST body and decode its inputs: (the body without its inputs, [(name, datatype, array)]).

    Runs in the data plane's helper process for large bodies (`serving.dataplane.offload`): JSON parsing and list
    conversion hold the GIL for their whole run, so a thread would stall the event loop all the same.
    With the served `signatures`, the inputs' declared shapes are judged against --max-batch-per-request
    (`max_rows`) and --max-request-memory-bytes (`memory_cap`) before any value is converted
    (`serving.dataplane.admission.check_declared`, on the signature `parameters.signature_name` names).

    Raises:
        InvalidRequestError: malformed JSON or inputs, or a declared batch above `max_rows`.
        ResourceExhaustedError: declared tensors above `memory_cap`, or a tensor above `max_bytes`.
    """
    parsed, binary = _split_body(header, body)
    items = _list(parsed.pop("inputs", None), "'inputs'")
    if signatures:
        params = parsed.get("parameters")
        name = params.get("signature_name", DEFAULT_SIGNATURE) if isinstance(params, dict) else DEFAULT_SIGNATURE
        shapes = {item["name"]: item["shape"] for item in items if isinstance(item, dict)
                  and isinstance(item.get("name"), str) and isinstance(item.get("shape"), list)
                  and all(type(d) is int for d in item["shape"])}
        check_declared(signatures.get(name) if isinstance(name, str) else None, shapes, max_rows, memory_cap)
    return parsed, _decode_inputs(items, binary, max_bytes)


def _requested_outputs(body: dict, default_binary: bool) -> tuple[list[str], dict[str, bool]]:
    names, binary = [], {}
    for index, item in enumerate(_list(body.get("outputs", []), "'outputs'")):
        item = _object(item, f"outputs[{index}]")
        name = item.get("name")
        if not isinstance(name, str):
            raise InvalidRequestError(f"outputs[{index}] needs a string 'name'")
        params = _object(item.get("parameters", {}), f"output {echo(name)} parameters")
        if "classification" in params:
            raise InvalidRequestError(f"output {echo(name)}: the classification extension is not supported; "
                                      "request the output itself")
        choice = params.get("binary_data", default_binary)
        if not isinstance(choice, bool):
            raise InvalidRequestError(f"output {echo(name)}: parameters.binary_data must be true or false")
        names.append(name)
        binary[name] = choice
    return names, binary


def encode_answer(model_name: str, version: int, tensors: list[tuple[str, np.ndarray]], binary: dict[str, bool],
                  default_binary: bool, request_id) -> tuple[bytes, list[bytes]]:
    """The V2 REST answer: its JSON (UTF-8) and the binary outputs that follow it (helper process when large)."""
    payload, blobs = _encode(model_name, version, tensors, binary, default_binary, request_id)
    return json.dumps(payload, separators=(",", ":")).encode(), blobs


def _encode(model_name: str, version: int, tensors: list[tuple[str, np.ndarray]], binary: dict[str, bool],
            default_binary: bool, request_id) -> tuple[dict, list[bytes]]:
    outputs, blobs = [], []
    for name, array in tensors:
        entry = {"name": name, "datatype": datatype_for(array.dtype), "shape": list(array.shape)}
        if binary.get(name, default_binary):
            blob = to_raw(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = to_json(name, array)
        outputs.append(entry)
    body = {"model_name": model_name, "model_version": str(version), "outputs": outputs}
    if request_id is not None:
        body["id"] = request_id
    return body, blobs


def _tensors(items) -> list[dict]:
    return [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in items]


def _config_tensors(items) -> list[dict]:
    return [{"name": t.name, "data_type": t.data_type, "dims": t.dims} for t in items]


class _V2Routes:
    """The Open Inference Protocol's REST handlers over one data plane (see the module docstring)."""

    def __init__(self, dataplane: DataPlane, timeout_s: float) -> None:
        self.dataplane, self.timeout_s = dataplane, timeout_s
        self.max_bytes = dataplane.limits.max_tensor_bytes

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        up = self.dataplane.server_ready()
        return web.json_response({"ready": up}, status=200 if up else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": SERVER_NAME, "version": server_version(), "extensions": list(EXTENSIONS)})

    async def model_metadata(self, request: web.Request) -> web.Response:
        ref = _ref(request)
        meta = await self.dataplane.metadata(ref)
        info = model_info(meta, self.dataplane.available_versions(ModelRef(ref.name)))
        body = {"name": info.name, "versions": info.versions, "platform": info.platform,
                "inputs": _tensors(info.inputs), "outputs": _tensors(info.outputs)}
        if meta.artifact is not None:  # which published artifact answers (`tfship serve --artifact`)
            body["parameters"] = artifact_parameters(meta.artifact)
        if meta.verification is not None:  # `--verify-key`: the verified version's record (scalars)
            body["parameters"] = body.get("parameters", {}) | verification_parameters(meta.verification)
        return web.json_response(body)

    async def config(self, request: web.Request) -> web.Response:
        info = model_config(await self.dataplane.metadata(_ref(request)), self.dataplane.limits.max_batch_per_request)
        return web.json_response({"name": info.name, "platform": info.platform, "backend": info.backend,
                                  "max_batch_size": info.max_batch_size, "input": _config_tensors(info.inputs),
                                  "output": _config_tensors(info.outputs)})

    async def model_ready(self, request: web.Request) -> web.Response:
        ref = _ref(request)
        up = self.dataplane.model_ready(ref)
        return web.json_response({"name": ref.name, "ready": up}, status=200 if up else 503)

    async def infer(self, request: web.Request) -> web.Response:
        raw_body = await read_body(request, self.timeout_s)
        header = request.headers.get(HEADER_LENGTH)
        checked = {}  # the body's answer options, the held version's signature and the outputs asked of it

        async def decode(meta: ModelMetadata | None) -> InferenceRequest | None:
            # parsed (and judged on its declared shapes) against the held version; a malformed body is answered
            # before a missing model, as before
            limits = self.dataplane.limits
            body, decoded = await self.dataplane.offloader.run_if_large(
                slow_bytes_of(header, raw_body), decode_body, header, raw_body, self.max_bytes,
                dict(meta.signatures) if meta else None, limits.max_batch_per_request, limits.max_request_memory_bytes)
            return _checked_request(meta, body, decoded, checked)

        result = await self.dataplane.predict_decoded(_ref(request), decode)  # one version: checked against, run on
        binary_choice, default_binary, request_id = checked["binary"], checked["default_binary"], checked["request_id"]
        tensors = ordered_outputs(result, checked["signature"], checked["outputs"])
        check_response_size(tensors, self.max_bytes)
        json_bytes = sum(a.nbytes for n, a in tensors if not binary_choice.get(n, default_binary)) * 4  # ~4x as text
        header, blobs = await self.dataplane.offloader.run_if_large(json_bytes, encode_answer, result.model_name,
                                                                    result.version, tensors, binary_choice,
                                                                    default_binary, request_id)
        return _response(request, header, blobs)


def _checked_request(meta: ModelMetadata | None, body: dict, decoded: list, checked: dict
                     ) -> InferenceRequest | None:
    """The request a decoded V2 body asks of the held version (`meta`; None: the model was not found, answered
    after the body's own errors); fills `checked` with the answer's options, signature and outputs.

    Raises:
        InvalidRequestError: bad parameters, id, inputs or outputs for the signature.
    """
    params = _object(body.get("parameters", {}), "'parameters'")
    default_binary = params.get("binary_data_output", False)
    if not isinstance(default_binary, bool):
        raise InvalidRequestError("parameter 'binary_data_output' must be true or false")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequestError(f"'id' must be a string, got {echo_json(request_id, 100)}")
    options = infer_options(params)
    if meta is None:
        return None
    signature = signature_of(meta.signatures, options.signature_name)
    names, binary = _requested_outputs(body, default_binary)
    inputs, outputs = check_inputs(signature, decoded), check_outputs(signature, names)
    checked.update(signature=signature, outputs=outputs, binary=binary, default_binary=default_binary,
                   request_id=request_id)
    return predict_request(meta, options, inputs, outputs)


def add_v2_routes(app: web.Application, dataplane: DataPlane, timeout_s: float = 30.0) -> None:
    """Add the Open Inference Protocol's REST routes (see the module docstring) to `app` (a
    `serving.http_calls.new_app` host); a request body must arrive within `timeout_s` seconds (else HTTP 408).
    """
    routes = _V2Routes(dataplane, timeout_s)
    app.router.add_get("/v2/health/live", routes.live)
    app.router.add_get("/v2/health/ready", routes.ready)
    app.router.add_get("/v2", routes.server_metadata)
    app.router.add_get(_MODEL, routes.model_metadata)
    app.router.add_get(_MODEL + "/ready", routes.model_ready)
    app.router.add_get(_MODEL + "/config", routes.config)
    app.router.add_post(_MODEL + "/infer", routes.infer, expect_handler=expect_within_limit)


def _response(request: web.Request, header: bytes, blobs: list[bytes]) -> web.Response:
    if blobs:
        response = web.Response(body=b"".join([header, *blobs]), content_type="application/octet-stream",
                                headers={HEADER_LENGTH: str(len(header))})
    else:
        response = web.Response(body=header, content_type="application/json")
    accepted = request.headers.get("Accept-Encoding", "")
    for coding in (ContentCoding.gzip, ContentCoding.deflate):  # what tritonclient can decompress
        if coding.value in accepted:
            response.enable_compression(coding)
            break
    return response
