"""A loopback round trip of two processes, on asyncio's event loop vs uvloop's (swarm/eventloop.py).

An echo server process and a client process, both on the same kind of loop, exchange length-prefixed
2,400-byte frames (a SmolLM2 decode step's hidden state) over TCP on 127.0.0.1, `--trips` times, with
no pause and with a pause between trips (the client idles like a peer computing a step, so both
processes wake from idle). Prints one JSON object: round-trip µs, p50 and p10, per loop and pause.

    .venv/bin/python scripts/bench_event_loop.py [--trips 400] [--pause-ms 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import struct
import subprocess
import sys
import time

import uvloop

HEADER = struct.Struct(">I")
FRAME = bytes(2400)


def loop_factory(kind: str):
    return uvloop.new_event_loop if kind == "uvloop" else asyncio.new_event_loop


async def echo_server(port: int) -> None:
    async def handle(reader, writer):
        try:
            while True:
                header = await reader.readexactly(HEADER.size)
                body = await reader.readexactly(HEADER.unpack(header)[0])
                writer.writelines((header, body))
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


async def round_trips(port: int, trips: int, pause_s: float) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    for _ in range(trips):
        if pause_s:
            time.sleep(pause_s)  # blocking on purpose: the process idles as if computing
        t0 = time.perf_counter()
        writer.writelines((HEADER.pack(len(FRAME)), FRAME))
        await writer.drain()
        header = await reader.readexactly(HEADER.size)
        await reader.readexactly(HEADER.unpack(header)[0])
        out.append((time.perf_counter() - t0) * 1e6)
    writer.close()
    return out


def measure(kind: str, trips: int, pause_ms: float) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        out = {}
        for pause in (0.0, pause_ms):
            with asyncio.Runner(loop_factory=loop_factory(kind)) as r:
                us = sorted(r.run(round_trips(port, trips, pause / 1000.0)))
            out[f"pause_{pause:g}ms"] = {"p50_us": round(statistics.median(us)),
                                         "p10_us": round(us[len(us) // 10])}
        return out
    finally:
        server.kill()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trips", type=int, default=400)
    ap.add_argument("--pause-ms", type=float, default=6.0)
    ap.add_argument("--serve", choices=("asyncio", "uvloop"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        with asyncio.Runner(loop_factory=loop_factory(args.serve)) as r:
            r.run(echo_server(args.port))
        return
    print(json.dumps({kind: measure(kind, args.trips, args.pause_ms) for kind in ("asyncio", "uvloop")},
                     indent=1))


if __name__ == "__main__":
    main()
