"""Regenerate `tf_serving_api.desc`: the TF Serving API protos as a FileDescriptorSet.

Development-time only (needs `tensorflow-serving-api`, hence TensorFlow). Walks the installed pb2
modules' `DESCRIPTOR`s transitively and writes every file they depend on, dependencies first, so
`core.protocol` can rebuild the same messages at runtime with `descriptor_pool` alone.

Usage: `python -m tfship.core.protos.build_descriptors [--output PATH]`
"""

from __future__ import annotations

import argparse
from pathlib import Path

from google.protobuf import descriptor_pb2

OUTPUT = Path(__file__).resolve().parent / "tf_serving_api.desc"


def _roots():
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_management_pb2,
        model_service_pb2,
        prediction_log_pb2,
        prediction_service_pb2,
    )
    from tensorflow_serving.config import model_server_config_pb2

    return [
        prediction_service_pb2, model_service_pb2, get_model_metadata_pb2, get_model_status_pb2,
        model_management_pb2, prediction_log_pb2, model_server_config_pb2, saved_model_pb2,
    ]


def build() -> bytes:
    """Serialize the transitive FileDescriptorSet of the TF Serving API (dependencies first)."""
    ordered: list = []
    seen: set[str] = set()

    def visit(file_descriptor) -> None:
        if file_descriptor.name in seen:
            return
        seen.add(file_descriptor.name)
        for dep in file_descriptor.dependencies:
            visit(dep)
        ordered.append(file_descriptor)

    for module in _roots():
        visit(module.DESCRIPTOR)
    fds = descriptor_pb2.FileDescriptorSet()
    for fd in ordered:
        proto = fds.file.add()
        fd.CopyToProto(proto)
    return fds.SerializeToString(deterministic=True)


def main(argv: list[str] | None = None) -> None:
    """CLI entry: write the descriptor set to `--output` (default: next to this script)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    data = build()
    args.output.write_bytes(data)
    print(f"wrote {args.output} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
