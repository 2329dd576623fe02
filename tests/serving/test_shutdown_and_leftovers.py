"""Exit within the grace period whatever the load, and nothing left behind or read for nothing.

* SIGTERM while a client is half-way through a 20 MB body: the process is gone within `--grace-period-s`
  plus a small margin (teardown of the models and the interpreter is not left to run past it).
* A `saved_model.pb` at protobuf's 2 GiB limit is refused before it is read (a sparse file: no disk used).
* Temp folders of a dead `--num-processes` parent are removed at the next start: tests/core/test_scratch.py and
  tests/serving/test_workers.py.
"""

from __future__ import annotations

import signal
import socket
import time

import pytest
from conftest import MODEL

from tfship.core.errors import ContractError
from tfship.core.saved_model import MAX_PROTO_BYTES, read_saved_model
from tfship.serving.launcher import ServerProcess

GRACE_S = 3.0
MARGIN_S = 2.5  # process start-up of the SIGTERM path, the log flush, and a shared machine


@pytest.mark.slow
def test_sigterm_with_half_a_body_sent_exits_within_the_grace_period(repository):
    with ServerProcess(repository, MODEL, backend="saved_model",
                       extra_args=("--grace-period-s", str(GRACE_S), "--file-system-poll-wait-seconds", "0")) as s:
        size = 20 << 20
        with socket.create_connection(("127.0.0.1", s.ports["rest"]), timeout=10) as conn:
            conn.sendall(f"POST /v1/models/{MODEL}:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {size}\r\n\r\n".encode() + b"[" * (size // 2))
            started = time.monotonic()
            s.process.send_signal(signal.SIGTERM)
            s.process.wait(GRACE_S + 30)
            took = time.monotonic() - started
    assert s.process.returncode == 0
    assert took <= GRACE_S + MARGIN_S, f"exited {took:.1f}s after SIGTERM with --grace-period-s {GRACE_S}"


def test_saved_model_at_the_protobuf_limit_is_refused_before_reading(tmp_path):
    with open(tmp_path / "saved_model.pb", "wb") as sparse:
        sparse.truncate(MAX_PROTO_BYTES)  # a hole: nothing on disk, 2 GiB to whoever reads it
    started = time.monotonic()
    with pytest.raises(ContractError, match="2 GiB message limit"):
        read_saved_model(tmp_path)
    assert time.monotonic() - started < 1.0
