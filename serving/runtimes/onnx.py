"""`onnx` backend: ONNX Runtime `InferenceSession`s on `model.onnx` and its signature files (CUDA EP when
available, else CPU).

An ONNX file holds one graph, so a SavedModel's other signatures travel as one file each beside
`model.onnx` (`serving_default`): `model.<signature>.onnx` (`signature_file_name`, e.g. `model.score.onnx`),
written by the pipeline's convert stage; this backend serves every one of them under its signature name.
A file whose tensors keep their values outside the version folder (external data at an absolute path, `..` or
through a link) is refused before ONNX Runtime opens it (`serving.runtimes.onnx_files`).
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature, TensorSpec
from tfship.core.saved_model import read_signatures
from tfship.serving.runtimes.base import Runtime, RuntimeLoadError, RuntimeOptions, input_rejected
from tfship.serving.runtimes.onnx_files import external_data_problems

log = logging.getLogger(__name__)
DEFAULT_SIGNATURE = "serving_default"
# A signature name that can be part of a file name on every system: `model.<signature>.onnx`.
_FILE_SAFE_SIGNATURE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}$")
_SIGNATURE_FILE = re.compile(r"^model\.(.+)\.onnx$")
_INDEX_ERROR = re.compile(r"out of (data )?bounds|out of range|invalid indice|not in \[", re.IGNORECASE)
_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int8)": "int8", "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
    "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64", "tensor(bool)": "bool", "tensor(string)": "string",
}


def _text_for_ort(name: str, value: np.ndarray) -> np.ndarray:
    """String tensors as object arrays of `str`, the one form ONNX Runtime reads correctly: it turns `bytes`
    objects into their repr ("b'a'") and misreads fixed-width `|S` arrays. gRPC `string_val` arrives as
    bytes, REST JSON as str; both decode as UTF-8 (TensorFlow's and TF Serving's text encoding).

    Raises:
        ModelInputError: bytes that are not UTF-8 text.
    """
    if value.dtype.kind not in "OSU":
        return value
    try:
        flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.ravel()]
    except UnicodeDecodeError as err:
        raise input_rejected("ONNX Runtime", {name: value}, f"string input is not UTF-8 text: {err}") from err
    return np.array(flat, dtype=object).reshape(value.shape)


def signature_file_name(signature: str) -> str | None:
    """The ONNX file of one signature: `model.onnx` for `serving_default`, `model.<signature>.onnx` for another
    (e.g. `model.score.onnx`); None when the name is not file-safe (letters, digits, `_`, `-`, `.`; at most 100
    characters, not starting with `.`), so it cannot travel as a file.
    """
    if signature == DEFAULT_SIGNATURE:
        return OnnxRuntime.FILE
    return f"model.{signature}.onnx" if _FILE_SAFE_SIGNATURE.match(signature) else None


def signature_files(version_dir: Path) -> dict[str, Path]:
    """{signature: its ONNX file} for the signature files in `version_dir` (`model.onnx` as `serving_default`
    when present, and every `model.<signature>.onnx`).
    """
    default = Path(version_dir) / OnnxRuntime.FILE
    found = {DEFAULT_SIGNATURE: default} if default.is_file() else {}
    for path in sorted(Path(version_dir).glob("model.*.onnx")):
        match = _SIGNATURE_FILE.match(path.name)
        if match and path.is_file() and signature_file_name(match.group(1)) == path.name:
            found[match.group(1)] = path
    return found


class OnnxRuntime(Runtime):
    """Serves `model.onnx` as the `serving_default` signature and each `model.<signature>.onnx` beside it as
    that signature (tf2onnx keeps each signature's input and output names), one session per file.

    Each contract comes from `saved_model.pb` next to the files when present (TF Serving's tensor names),
    otherwise from the session's inputs/outputs (symbolic dims become unknown).
    """

    name = "onnx"
    FILE = "model.onnx"
    artifact_files = (FILE,)  # `--artifact onnx`; the signature files beside it come along

    def __init__(self, version_dir: Path, options: RuntimeOptions | None = None) -> None:
        super().__init__(version_dir, options)
        self._sessions: dict = {}  # signature name -> InferenceSession
        self._signatures: dict[str, Signature] = {}
        self.providers: tuple[str, ...] = ()

    @classmethod
    def can_serve(cls, version_dir: Path) -> bool:
        return (Path(version_dir) / cls.FILE).is_file() and importlib.util.find_spec("onnxruntime") is not None

    def load(self) -> None:
        files = signature_files(self.version_dir)
        if DEFAULT_SIGNATURE not in files:
            raise RuntimeLoadError(f"cannot load {self.version_dir / self.FILE}: no such file")
        path = files[DEFAULT_SIGNATURE]
        for file in files.values():  # before ONNX Runtime opens anything the file names
            try:
                problems = external_data_problems(file)
            except (OSError, ValueError) as err:
                raise RuntimeLoadError(f"cannot load {file}: not an ONNX file: {err}") from err
            if problems:
                more = f" (+{len(problems) - 2} more)" if len(problems) > 2 else ""
                raise RuntimeLoadError(f"refused {file}: {'; '.join(problems[:2])}{more}")
        try:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = self.options.intra_op_threads
            so.inter_op_num_threads = self.options.inter_op_threads
            requested = choose_providers(self.options.use_gpu, ort.get_available_providers())
            for name, path in files.items():
                self._sessions[name] = ort.InferenceSession(str(path), so, providers=requested)
        except Exception as err:
            self._sessions = {}
            raise RuntimeLoadError(f"cannot load {path}: {err}") from err
        self.providers = tuple(self._sessions[DEFAULT_SIGNATURE].get_providers())  # what the session holds
        if requested[0] != self.providers[0]:
            log.warning("%s: asked ONNX Runtime for %s, the session runs on %s (CUDA libraries missing or no "
                        "device)", self.version_dir, requested[0], self.providers[0])
        else:
            log.info("%s: ONNX Runtime session on %s", self.version_dir, ", ".join(self.providers))
        declared = read_signatures(self.version_dir, include_internal=True) \
            if (self.version_dir / "saved_model.pb").is_file() else {}
        self._signatures = {name: _contract(name, session, declared.get(name))
                            for name, session in self._sessions.items()}
        self.ready = True

    def predict(self, inputs: Mapping[str, np.ndarray],
                signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        session = self._sessions[signature_name]  # the data plane asked metadata() for the name first
        names = list(self._signatures[signature_name].outputs)
        feed = {name: _text_for_ort(name, np.asarray(value)) for name, value in inputs.items()}
        try:
            values = session.run(names, feed)
        except Exception as err:
            if _is_input_error(err):
                raise input_rejected("ONNX Runtime", inputs, err) from err
            raise
        return dict(zip(names, values))

    def metadata(self) -> dict[str, Signature]:
        return dict(self._signatures)

    def unload(self) -> None:
        self._sessions, self._signatures = {}, {}
        super().unload()


def _contract(name: str, session, declared: Signature | None) -> Signature:
    """The SavedModel's contract of signature `name` when its names equal the session's, else the session's."""
    own = Signature(
        name=name,
        inputs={i.name: _spec(i) for i in session.get_inputs()},
        outputs={o.name: _spec(o) for o in session.get_outputs()},
    )
    if declared and set(declared.inputs) == set(own.inputs) and set(declared.outputs) == set(own.outputs):
        return declared
    return own


def choose_providers(use_gpu: bool, available: list[str]) -> list[str]:
    """The execution providers to ask ONNX Runtime for, in order: CUDA first when `use_gpu` and this
    onnxruntime build offers it (onnxruntime-gpu), CPU always last as the fallback.

    What the session really uses is read back after it is built (`OnnxRuntime.providers`): CUDA can be offered
    by the build yet unusable (no driver, no device), and ONNX Runtime then falls back to CPU.
    """
    return (["CUDAExecutionProvider"] if use_gpu and "CUDAExecutionProvider" in available else []) + [
        "CPUExecutionProvider"]


def _is_input_error(err: Exception) -> bool:
    """ONNX Runtime's INVALID_ARGUMENT status, or a RuntimeException from an index check (GatherND's
    `invalid indice found`); anything else is a server fault.
    """
    kind = type(err).__name__
    text = str(err)
    return kind == "InvalidArgument" or (kind == "RuntimeException" and _INDEX_ERROR.search(text) is not None)


def _spec(node) -> TensorSpec:
    shape = None if node.shape is None else tuple(d if isinstance(d, int) and d >= 0 else None for d in node.shape)
    return TensorSpec(dtype=_ORT_TYPES.get(node.type) or node.type, shape=shape, tensor_name=node.name)

