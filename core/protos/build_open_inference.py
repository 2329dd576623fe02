"""Regenerate `open_inference.desc` from `open_inference.proto` (the Open Inference Protocol's messages).

Development-time only: needs `grpcio-tools` (protoc), which the serving package does not. It is not in
the project's environment (it would upgrade setuptools there); use a throwaway one:

    python3.11 -m venv /tmp/protoc && /tmp/protoc/bin/pip install grpcio-tools==1.85.1
    /tmp/protoc/bin/python -m tfship.core.protos.build_open_inference

The descriptor is a serialized `FileDescriptorSet` holding the one file (it imports nothing), written
deterministically; `core.kserve_protocol` loads it into tfship's private descriptor pool.
`tests/serving/test_kserve_codec.py` checks it against the `.proto` text and against tritonclient's own
messages, field by field.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "open_inference.proto"
OUTPUT = HERE / "open_inference.desc"


def build() -> bytes:
    """Run protoc (grpc_tools) on `open_inference.proto`; return the FileDescriptorSet bytes.

    Raises:
        RuntimeError: protoc reported an error (its exit status is named).
    """
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc  # pyright: ignore[reportMissingImports]  # the maintainer's tool: grpcio-tools, by hand

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.desc"
        status = protoc.main(["protoc", f"--proto_path={HERE}", f"--descriptor_set_out={out}", PROTO.name])
        if status != 0:
            raise RuntimeError(f"protoc failed on {PROTO} (exit {status})")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return files.SerializeToString(deterministic=True)


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
