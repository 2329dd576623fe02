"""`tfship.Client(target)`: predict and metadata against a tfship or TF Serving server, over gRPC or REST.

`target` picks the protocol: `host:port` is gRPC (`serving.tfs.client.PredictClient`), `http://host:port` or
`https://...` is REST (TF Serving's `/v1/models/...` routes, JSON in the columnar `inputs` form). Both
return outputs as numpy arrays by output alias, cast to the signature's dtypes; both need no TensorFlow.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Self

import numpy as np
from google.protobuf import json_format

from tfship.core import protocol
from tfship.core.contract import Signature
from tfship.core.errors import HTTP_STATUS_OF_GRPC_CODE, ConfigError, ErrorStatus, TfshipError, UnavailableError
from tfship.core.saved_model import from_signature_def
from tfship.serving.tfs.client import PredictClient

MAX_ERROR_CHARS = 2000  # of a REST error body quoted in the raised error


class RestError(TfshipError):
    """A REST call answered with an HTTP error; `http_status` is its code, the message the server's `error`."""

    def __init__(self, http_status: int, message: str) -> None:
        super().__init__(f"HTTP {http_status}: {message}")
        codes = [code for code, http in HTTP_STATUS_OF_GRPC_CODE.items() if http == http_status]
        self.status = ErrorStatus(codes[0] if codes else "INTERNAL", http=http_status)


class Client:
    """Predict and metadata for one model (or any, by `model_name=` per call).

    Args:
        target: `host:port` (gRPC) or `http(s)://host:port` (REST).
        model_name: default model of the calls.
        timeout_s: per-call deadline, seconds.
        token: bearer token (`authorization: Bearer ...`), for servers started with auth.

    Raises (from the calls):
        RemoteError (gRPC) / RestError (REST): the server refused the call (status code and message);
        UnavailableError: nothing answers at `target`; ConfigError: no model name given.
    """

    def __init__(self, target: str, model_name: str | None = None, *, timeout_s: float = 30.0,
                 token: str | None = None) -> None:
        self.target = target
        self.model_name = model_name
        self.protocol = "rest" if target.startswith(("http://", "https://")) else "grpc"
        self._timeout_s = timeout_s
        self._token = token
        self._signatures: dict[tuple[str, int | None], dict[str, Signature]] = {}
        self._grpc = None
        if self.protocol == "grpc":
            self._grpc = PredictClient(target, timeout_s=timeout_s, token=token)

    def __repr__(self) -> str:
        return f"Client({self.target!r}, model_name={self.model_name!r}, protocol={self.protocol!r})"

    def close(self) -> None:
        if self._grpc is not None:
            self._grpc.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _model(self, model_name: str | None) -> str:
        name = model_name or self.model_name
        if not name:
            raise ConfigError("Client: give model_name (to the Client or the call)")
        return name

    def metadata(self, model_name: str | None = None, version: int | None = None) -> dict[str, Signature]:
        """The model's signatures by name (inputs and outputs: alias -> dtype and shape, -1/None unknown)."""
        name = self._model(model_name)
        if self._grpc is not None:
            signatures = self._grpc.metadata(name, version)
        else:
            body = self._rest("GET", f"{self._path(name, version)}/metadata")
            defs = json_format.ParseDict(body["metadata"]["signature_def"], protocol.SignatureDefMap(),
                                         ignore_unknown_fields=True)
            signatures = {k: from_signature_def(k, v) for k, v in defs.signature_def.items()}
        self._signatures[(name, version)] = signatures
        return signatures

    def predict(self, inputs: Mapping[str, np.ndarray] | np.ndarray, model_name: str | None = None, *,
                signature_name: str = "serving_default", version: int | None = None) -> dict[str, np.ndarray]:
        """Run the signature on a batch: `inputs` is {alias: [B, ...] array}, or one array for a one-input
        signature; returns {output alias: [B, ...] array}. Inputs are cast to the signature's dtypes.
        """
        name = self._model(model_name)
        signature = self._signature(name, version, signature_name)
        if not isinstance(inputs, Mapping):
            if len(signature.inputs) != 1:
                raise ConfigError(f"{name}/{signature_name} has inputs {list(signature.inputs)}: pass a dict")
            inputs = {next(iter(signature.inputs)): inputs}
        arrays = {k: _cast(np.asarray(v), signature.inputs.get(k)) for k, v in inputs.items()}
        if self._grpc is not None:
            return self._grpc.predict(name, arrays, signature_name=signature_name, version=version)
        body = {"signature_name": signature_name, "inputs": {k: v.tolist() for k, v in arrays.items()}}
        outputs = self._rest("POST", f"{self._path(name, version)}:predict", body)["outputs"]
        if not isinstance(outputs, dict):  # TF Serving's columnar answer for a one-output signature
            outputs = {next(iter(signature.outputs)): outputs}
        return {k: _cast(np.asarray(v), signature.outputs.get(k)) for k, v in outputs.items()}

    def _signature(self, name: str, version: int | None, signature_name: str) -> Signature:
        signatures = self._signatures.get((name, version)) or self.metadata(name, version)
        if signature_name not in signatures:
            raise ConfigError(f"{name} has no signature {signature_name!r}; it has {sorted(signatures)}")
        return signatures[signature_name]

    @staticmethod
    def _path(name: str, version: int | None) -> str:
        return f"/v1/models/{name}" + (f"/versions/{version}" if version is not None else "")

    def _rest(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.target.rstrip("/") + path, data=data, method=method,
                                         headers={"content-type": "application/json"} | (
                                             {"authorization": f"Bearer {self._token}"} if self._token else {}))
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            text = err.read().decode("utf-8", "replace")
            try:
                text = json.loads(text).get("error", text)
            except (ValueError, AttributeError):
                pass
            raise RestError(err.code, str(text)[:MAX_ERROR_CHARS]) from err
        except (urllib.error.URLError, OSError) as err:
            raise UnavailableError(f"{self.target}: {getattr(err, 'reason', err)}") from err


def _cast(array: np.ndarray, spec) -> np.ndarray:
    if spec is None or spec.dtype == "string":
        return array
    return array.astype(spec.dtype, copy=False)
