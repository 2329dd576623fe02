"""A SignatureDef's inputs and outputs are a protobuf map: no order, and the Python runtime iterates a parsed
map in an order that changes from process to process. The contract read from one lists its aliases sorted, so
every process (client, server, pipeline) sees the same order."""

from __future__ import annotations

import subprocess
import sys

from tfship.core.contract import Signature, TensorSpec
from tfship.core.saved_model import from_signature_def, to_signature_def

NAMES = ("worst", "mean", "se", "zeta", "alpha", "item_id", "history", "dense")


def _serialized() -> bytes:
    specs = tuple(TensorSpec(name=n, dtype="float32", shape=(None, 1)) for n in NAMES)
    return to_signature_def(Signature.of("serving_default", specs, specs)).SerializeToString()


def test_aliases_come_sorted_in_every_process():
    payload = _serialized().hex()
    code = ("import sys; from tfship.core.saved_model import from_signature_def, to_signature_def; "
            "from tfship.core.contract import Signature; "
            "message = type(to_signature_def(Signature.of('x', (), ())))(); "
            "message.ParseFromString(bytes.fromhex(sys.argv[1])); "
            "s = from_signature_def('serving_default', message); print(','.join(s.input_names()), "
            "','.join(s.output_names()))")
    seen = {subprocess.run([sys.executable, "-c", code, payload], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed)}).stdout.strip() for seed in range(4)}
    names = ",".join(sorted(NAMES))
    assert seen == {f"{names} {names}"}, seen


def test_the_contract_read_back_lists_aliases_sorted():
    message = type(to_signature_def(Signature.of("x", (), ())))()
    message.ParseFromString(_serialized())
    assert from_signature_def("serving_default", message).input_names() == tuple(sorted(NAMES))
