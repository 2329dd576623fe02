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
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np

PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
CLK_TCK = os.sysconf("SC_CLK_TCK")


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


def host_cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) clock ticks of every CPU since boot, from the `cpu` line of /proc/stat (proc(5)); None
    where it cannot be read or has no steal column (not Linux, or no hypervisor accounting)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (fields[7], sum(fields)) if len(fields) == 8 else None


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Stolen share of the host's CPU ticks between two `host_cpu_ticks` readings (0..1), or None."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all its threads (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14 and 15 of stat(5)


def processes_cpu_s(pids: list[int]) -> float:
    """Sum of `process_cpu_s` over `pids` (dead processes count 0), seconds."""
    total = 0.0
    for pid in pids:
        try:
            total += process_cpu_s(pid)
        except (OSError, IndexError):
            pass
    return total


def thread_counters(pids: list[int]) -> dict[str, list[float]]:
    """Per thread group of `pids`: [CPU seconds, run-queue wait seconds, voluntary and involuntary context
    switches], summed, from /proc/<pid>/task/<tid>/{schedstat,status}.

    Groups: `main` (the thread whose tid is the pid: the event loop in tfship and the references), else the
    thread's name (`event_engine`, `python` for grpc.aio's poller, `tfship-model_0`... digits dropped).
    """
    groups: dict[str, list[float]] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                run_ns, wait_ns, _slices = Path(f"{base}/schedstat").read_text().split()
                status = Path(f"{base}/status").read_text()
            except (OSError, ValueError):
                continue
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            name = "main" if tid == str(pid) else fields.get("Name", "?").strip().rstrip("0123456789_")
            group = groups.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            group[0] += int(run_ns) / 1e9
            group[1] += int(wait_ns) / 1e9
            group[2] += int(fields.get("voluntary_ctxt_switches", "0"))
            group[3] += int(fields.get("nonvoluntary_ctxt_switches", "0"))
    return groups


def thread_deltas(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """`thread_counters` differences over a window: cpu_s, wait_s, voluntary, involuntary per group."""
    keys = ("cpu_s", "wait_s", "voluntary", "involuntary")
    zero = [0.0] * 4
    return {name: dict(zip(keys, (a - b for a, b in zip(values, before.get(name, zero)))))
            for name, values in after.items()}


def batch_histogram(metrics_urls: list[str]) -> tuple[float, float]:
    """(sum of rows, number of backend calls) of `tfship_batch_size` summed over the servers' /metrics."""
    rows = calls = 0.0
    for url in metrics_urls:
        text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("tfship_batch_size_sum"):
                rows += float(line.rsplit(" ", 1)[1])
            elif line.startswith("tfship_batch_size_count"):
                calls += float(line.rsplit(" ", 1)[1])
    return rows, calls


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
    cpu0 = (processes_cpu_s(server_pids), time.process_time())
    ticks0 = host_cpu_ticks()
    threads0 = thread_counters(server_pids)
    hist0 = await asyncio.to_thread(batch_histogram, metrics_urls)
    await asyncio.sleep(max(end_w - time.perf_counter(), 0.0))
    cpu1 = (processes_cpu_s(server_pids), time.process_time())
    ticks1 = host_cpu_ticks()
    threads1 = thread_counters(server_pids)
    hist1 = await asyncio.to_thread(batch_histogram, metrics_urls)
    calls = hist1[1] - hist0[1]
    stop.set()
    await asyncio.gather(*tasks)
    lat_ms = np.asarray(latencies) * 1e3
    stats = (
        {
            "p50": float(np.percentile(lat_ms, 50)),
            "p90": float(np.percentile(lat_ms, 90)),
            "p99": float(np.percentile(lat_ms, 99)),
            "mean": float(lat_ms.mean()),
            "max": float(lat_ms.max()),
        }
        if lat_ms.size
        else {}
    )
    return LevelResult(
        concurrency=concurrency,
        window_s=window_s,
        requests=len(latencies),
        errors=sum(errors.values()),
        error_codes=errors,
        inferences_per_s=len(latencies) * rows / window_s,
        requests_per_s=len(latencies) / window_s,
        latency_ms=stats,
        server_cpu=(cpu1[0] - cpu0[0]) / window_s if server_pids else None,
        loadgen_cpu=(cpu1[1] - cpu0[1]) / window_s,
        mean_batch_rows=(hist1[0] - hist0[0]) / calls if calls else None,
        server_threads=thread_deltas(threads0, threads1),
        host_steal=steal_share(ticks0, ticks1),
    )


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
