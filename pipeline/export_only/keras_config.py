"""A Keras file's config judged before Keras deserialises it: what it names must be Keras's own or registered.

Deserialising a `.keras` / `.h5` file imports the modules its config names and calls what it finds there, so a
file can run code before any graph exists. `keras_config_problems` reads the config alone (`config.json` of the
`.keras` zip, the `model_config` attribute of an `.h5` file) and refuses:

* `Lambda` layers (Python code stored in or named by the file) and Python `__lambda__` objects;
* `TFSMLayer` (loads a SavedModel from a path on the host, running its restore and init functions);
* any object whose `module` is not Keras's (`keras`, `keras.*`) unless its `registered_name` is one that is
  registered now (`@keras.saving.register_keras_serializable`, e.g. by a `--custom-objects` module);
* a `registered_name` no one registered.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 64 << 20  # a config this large is not a model's (a zip bomb's, perhaps)
_CODE_CLASSES = {"Lambda": "a Lambda layer runs Python code stored in or named by the file",
                 "__lambda__": "a Python lambda stored as bytecode",
                 "TFSMLayer": "a TFSMLayer loads a SavedModel from a path on the host, running its functions"}


def read_keras_config(path: Path) -> Any:
    """The model config of a `.keras` or `.h5` file, parsed from JSON without deserialising anything.

    Raises:
        ValueError: the file holds no readable config (not a zip / HDF5, no config, too large, not JSON).
    """
    path = Path(path)
    if path.suffix == ".keras":
        try:
            with zipfile.ZipFile(path) as archive:
                info = archive.getinfo("config.json")
                if info.file_size > MAX_CONFIG_BYTES:
                    raise ValueError(f"config.json is {info.file_size} bytes (at most {MAX_CONFIG_BYTES})")
                return json.loads(archive.read(info))
        except (zipfile.BadZipFile, KeyError, OSError, json.JSONDecodeError) as err:
            raise ValueError(f"no readable config.json: {type(err).__name__}: {err}") from err
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            text = handle.attrs.get("model_config")
    except OSError as err:
        raise ValueError(f"not an HDF5 file: {err}") from err
    if text is None:
        raise ValueError("no model_config attribute")
    return json.loads(text.decode() if isinstance(text, bytes) else text)


def _objects(value: Any, where: str = "config") -> Iterator[tuple[str, dict]]:
    """(path of layer names, object) of every serialised object (a dict with `class_name`) in `value`."""
    if isinstance(value, dict):
        inner = value.get("config")
        name = inner.get("name") if isinstance(inner, dict) else None
        here = f"{where}/{name}" if isinstance(name, str) else where
        if "class_name" in value:
            yield here, value
        for item in value.values():
            yield from _objects(item, here)
    elif isinstance(value, list):
        for item in value:
            yield from _objects(item, where)


def _is_keras(module: Any) -> bool:
    return module is None or module == "keras" or (isinstance(module, str) and module.startswith("keras."))


def keras_config_problems(config: Any) -> tuple[list[str], list[str]]:
    """(code: one line per object that deserialising would run, unregistered: the class names from outside
    Keras that no imported module registers), as the module docstring says.
    """
    import keras

    code, unregistered = [], []
    for where, item in _objects(config):
        class_name, module, registered = item.get("class_name"), item.get("module"), item.get("registered_name")
        if class_name in _CODE_CLASSES:
            code.append(f"{str(class_name)[:80]!r} at {where[:160]}: {_CODE_CLASSES[class_name]}")
        elif not _is_keras(module) or (module is None and registered is not None):
            if registered is None or keras.saving.get_registered_object(str(registered)) is None:
                unregistered.append(str(class_name)[:80] + (f"' from module '{str(module)[:80]}" if module else ""))
    return list(dict.fromkeys(code)), list(dict.fromkeys(unregistered))
