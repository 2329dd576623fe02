"""Closed-loop gRPC load generator for TF Serving's `Predict`, run in its own process.

Each of `concurrency` asyncio workers sends the same pre-serialised `PredictRequest` bytes, waits
for the answer, and sends again (closed loop: offered load follows the server). Requests and
responses stay raw bytes (no protobuf work on this side). After `warmup_s` a fixed window of
`window_s` seconds is measured: only calls that start and end inside it count.

Run as `python -m bench.serve.loadgen --target HOST:PORT --request-file REQ.bin ...`; prints one JSON
object per concurrency level (see `LevelResult`) as a JSON list on stdout, or writes it to `--out`.
With `--rest-url http://HOST:PORT/v1/models/NAME:predict` the same closed loop POSTs the request file
as a JSON body over HTTP/1.1 (one keep-alive connection per worker) instead; a non-200 answer is an error.
Only grpcio and numpy are imported, so the process starts fast and stays light.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np

from bench.serve.server_counters import (
    batch_histogram,
    host_cpu_ticks,
    processes_cpu_s,
    steal_share,
    thread_counters,
    thread_deltas,
)

PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"


@dataclass(frozen=True)
class LevelResult:
    """One measured window at one concurrency level.

    Attributes:
        concurrency: workers with one request in flight each.
        window_s: measured window length, seconds.
        requests: calls that started and finished OK inside the window.
        errors: calls that failed (any non-OK status) inside the window.
        error_codes: status name -> count, for the failures.
        inferences_per_s: rows answered per second (requests x rows per request / window_s).
        requests_per_s: calls answered per second.
        latency_ms: p50, p90, p99, mean, max of successful calls, milliseconds.
        server_cpu: server process CPU time / window_s, in cores (1.0 = one core busy); None without a pid.
        loadgen_cpu: this process' CPU time / window_s, in cores.
        mean_batch_rows: rows per backend call during the window (server's `tfship_batch_size`
            histogram, batching on only); None when not scraped or no batch ran.
        server_threads: per server thread group (`thread_counters`): CPU seconds, run-queue wait seconds,
            voluntary and involuntary context switches during the window; where the server's core went.
        host_steal: share of the host's CPU time (all cores) that the hypervisor gave to other guests during
            the window (`host_cpu_ticks`), 0..1; None where /proc/stat has no steal column. A window with
            much of it measured the host, not the server.
    """

    concurrency: int
    window_s: float
    requests: int
    errors: int
    error_codes: dict[str, int]
    inferences_per_s: float
    requests_per_s: float
    latency_ms: dict[str, float]
    server_cpu: float | None
    loadgen_cpu: float
    mean_batch_rows: float | None = None
    server_threads: dict[str, dict[str, float]] | None = None
    host_steal: float | None = None


async def _worker(
    call,
    payload: bytes,
    stop: asyncio.Event,
    window: tuple[float, float],
    latencies: list[float],
    errors: dict[str, int],
    timeout_s: float,
) -> None:
    start_w, end_w = window
    clock = time.perf_counter
    while not stop.is_set():
        t0 = clock()
        try:
            await call(payload, timeout=timeout_s)
            ok, code = True, ""
        except grpc.aio.AioRpcError as err:
            ok, code = False, err.code().name
        except RestError as err:
            ok, code = False, f"HTTP {err.status}"
        t1 = clock()
        if t0 >= start_w and t1 <= end_w:
            if ok:
                latencies.append(t1 - t0)
            else:
                errors[code] = errors.get(code, 0) + 1


class RestError(Exception):
    """A REST call answered with a status other than 200."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class RestConnection:
    """One HTTP/1.1 keep-alive connection POSTing prebuilt request bytes (headers and body in one write).

    Hand-rolled on asyncio streams (TCP_NODELAY is asyncio's default) so the client costs little next to
    the server: an aiohttp client session costs more CPU per call than the servers being measured.
    """

    def __init__(self, url: str, payload: bytes) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.request = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
        self.reader = self.writer = None

    async def open(self) -> RestConnection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def call(self, payload: bytes, timeout: float) -> bytes:
        """Send the request (`payload` is already in it), read one response; `RestError` unless 200."""
        self.writer.write(self.request)
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout)
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await self.reader.readexactly(length)
        if status != 200:
            raise RestError(status)
        return body

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def run_level(
    channels: list,
    payload: bytes,
    rows: int,
    concurrency: int,
    warmup_s: float,
    window_s: float,
    server_pids: list[int],
    metrics_urls: list[str] = (),
    timeout_s: float = 30.0,
    method: str = PREDICT_METHOD,
) -> LevelResult:
    """Measure one concurrency level: warm up `warmup_s`, then a `window_s` window (seconds)."""
    # gRPC channels: no (de)serialiser, raw bytes both ways; anything else is already a `call` (REST).
    calls = [ch.unary_unary(method) if isinstance(ch, grpc.aio.Channel) else ch for ch in channels]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    stop = asyncio.Event()
    start_w = time.perf_counter() + warmup_s
    end_w = start_w + window_s
    tasks = [
        asyncio.create_task(
            _worker(calls[i % len(calls)], payload, stop, (start_w, end_w), latencies, errors, timeout_s)
        )
        for i in range(concurrency)
    ]
    await asyncio.sleep(max(start_w - time.perf_counter(), 0.0))
    before = await _ServerSample.take(server_pids, metrics_urls)
    await asyncio.sleep(max(end_w - time.perf_counter(), 0.0))
    after = await _ServerSample.take(server_pids, metrics_urls)
    stop.set()
    await asyncio.gather(*tasks)
    backend_calls = after.batch[1] - before.batch[1]
    return LevelResult(
        concurrency=concurrency,
        window_s=window_s,
        requests=len(latencies),
        errors=sum(errors.values()),
        error_codes=errors,
        inferences_per_s=len(latencies) * rows / window_s,
        requests_per_s=len(latencies) / window_s,
        latency_ms=latency_stats(latencies),
        server_cpu=(after.server_cpu_s - before.server_cpu_s) / window_s if server_pids else None,
        loadgen_cpu=(after.own_cpu_s - before.own_cpu_s) / window_s,
        mean_batch_rows=(after.batch[0] - before.batch[0]) / backend_calls if backend_calls else None,
        server_threads=thread_deltas(before.threads, after.threads),
        host_steal=steal_share(before.ticks, after.ticks),
    )


@dataclass(frozen=True)
class _ServerSample:
    """The counters read at one edge of the window: servers' and own CPU seconds, host ticks, thread groups,
    and the batch-size histogram's (rows, calls)."""

    server_cpu_s: float
    own_cpu_s: float
    ticks: tuple[int, int] | None
    threads: dict[str, list[float]]
    batch: tuple[float, float]

    @classmethod
    async def take(cls, server_pids: list[int], metrics_urls: list[str]) -> _ServerSample:
        return cls(processes_cpu_s(server_pids), time.process_time(), host_cpu_ticks(), thread_counters(server_pids),
                   await asyncio.to_thread(batch_histogram, metrics_urls))


def latency_stats(latencies: list[float]) -> dict[str, float]:
    """p50/p90/p99/mean/max of `latencies` (seconds) in milliseconds; {} when there are none."""
    lat_ms = np.asarray(latencies) * 1e3
    if not lat_ms.size:
        return {}
    return {"p50": float(np.percentile(lat_ms, 50)), "p90": float(np.percentile(lat_ms, 90)),
            "p99": float(np.percentile(lat_ms, 99)), "mean": float(lat_ms.mean()), "max": float(lat_ms.max())}


async def run_levels(
    target: str,
    payload: bytes,
    rows: int,
    levels: list[int],
    warmup_s: float,
    window_s: float,
    server_pids: list[int],
    channels: int,
    metrics_urls: list[str] = (),
    method: str = PREDICT_METHOD,
) -> list[LevelResult]:
    """Run every concurrency level in `levels` against `target`; `channels` TCP connections (min 1).

    Each channel gets its own subchannel pool, hence its own connection, so SO_REUSEPORT servers
    sharing the port each receive a share of the connections.
    """
    options = [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20),
    ]
    chans = [grpc.aio.insecure_channel(target, options=options) for _ in range(max(channels, 1))]
    try:
        for ch in chans:
            await asyncio.wait_for(ch.channel_ready(), 30.0)
        return [
            await run_level(chans, payload, rows, c, warmup_s, window_s, server_pids, metrics_urls, method=method)
            for c in levels
        ]
    finally:
        for ch in chans:
            await ch.close()


async def run_rest_levels(
    url: str,
    payload: bytes,
    rows: int,
    levels: list[int],
    warmup_s: float,
    window_s: float,
    server_pids: list[int],
    metrics_urls: list[str] = (),
) -> list[LevelResult]:
    """`run_levels` over REST: each of the `c` workers POSTs `payload` to `url` on its own keep-alive connection."""
    results = []
    for c in levels:
        connections = [await RestConnection(url, payload).open() for _ in range(c)]
        try:
            calls = [conn.call for conn in connections]
            results.append(await run_level(calls, payload, rows, c, warmup_s, window_s, server_pids, metrics_urls))
        finally:
            for conn in connections:
                await conn.close()
    return results


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit code 0 when every level ran (errors are counted, not fatal)."""
    p = argparse.ArgumentParser(prog="python -m bench.serve.loadgen", description=__doc__.splitlines()[0])
    p.add_argument("--target", help="host:port of the gRPC server")
    p.add_argument("--rest-url", help="REST :predict URL (instead of --target); the request file is JSON")
    p.add_argument("--request-file", type=Path, required=True, help="serialised PredictRequest bytes")
    p.add_argument("--rows", type=int, default=1, help="rows (inferences) per request")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated levels")
    p.add_argument("--warmup-s", type=float, default=1.0, help="seconds before each window")
    p.add_argument("--window-s", type=float, default=5.0, help="measured window, seconds")
    p.add_argument(
        "--server-pid", type=int, action="append", default=[], help="server pid(s) for CPU accounting"
    )
    p.add_argument(
        "--metrics-url", action="append", default=[], help="server http://host:port for batch sizes"
    )
    p.add_argument(
        "--channels", type=int, default=1, help="gRPC connections to open (SO_REUSEPORT: > servers)"
    )
    p.add_argument("--cpu", type=int, action="append", default=[], help="pin this process to these cores")
    p.add_argument("--grpc-method", default=PREDICT_METHOD, help="full gRPC method the request file is for")
    p.add_argument("--out", type=Path, help="write the JSON list here instead of stdout")
    args = p.parse_args(argv)
    if args.cpu:
        os.sched_setaffinity(0, set(args.cpu))
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.rest_url:
        coro = run_rest_levels(args.rest_url, args.request_file.read_bytes(), args.rows, levels,
                               args.warmup_s, args.window_s, args.server_pid, args.metrics_url)
    elif args.target:
        coro = run_levels(
            args.target,
            args.request_file.read_bytes(),
            args.rows,
            levels,
            args.warmup_s,
            args.window_s,
            args.server_pid,
            args.channels,
            args.metrics_url,
            args.grpc_method,
        )
    else:
        p.error("give --target (gRPC) or --rest-url (REST)")
    results = asyncio.run(coro)
    text = json.dumps([asdict(r) for r in results], indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
