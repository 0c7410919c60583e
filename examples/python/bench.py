#!/usr/bin/env python3
"""Per-call overhead of toa.py over a raw HTTP handler: a benchmark, not a test.

    python3 examples/python/bench.py [--calls N]

Starts two programs the way the agent starts one (TOA_PORT, TOA_AGENT, TOA_COMPONENT): a component
on toa.py with an `echo` operation, and the same operation answered by a bare
`BaseHTTPRequestHandler` that writes its answer in one piece. Sends `POST /operations/echo` to each,
as the agent does (one keep-alive connection per caller), with one caller and with 16, and prints
the p50 and p99 of each and the ratio toa.py / raw. The numbers go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

COMPONENT = """
from toa import Component
component = Component()

@component.operation
def echo(input, context):
    return input

component.run()
"""

RAW = """
import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        body = json.dumps({"reply": request.get("input")}).encode()
        head = (f"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n"
                f"content-length: {len(body)}\\r\\n\\r\\n").encode()
        self.wfile.write(head + body)

server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["TOA_PORT"])), Handler)
server.daemon_threads = True
server.serve_forever()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(source):
    port = free_port()
    env = dict(os.environ, TOA_PORT=str(port), TOA_AGENT="http://127.0.0.1:1",
               TOA_COMPONENT="bench.echo", PYTHONPATH=str(HERE))
    process = subprocess.Popen([sys.executable, "-c", source], env=env)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, port
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise SystemExit(f"the program on {port} did not start")
            time.sleep(0.05)


def caller(port, calls, times):
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.connect()
    # As the agent's client does: no Nagle on the caller's side.
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = json.dumps({"input": {"n": 1}, "call": {"id": "b", "redelivered": False}})
    headers = {"content-type": "application/json"}
    for _ in range(calls):
        start = time.perf_counter()
        connection.request("POST", "/operations/echo", body, headers)
        answer = json.loads(connection.getresponse().read())
        times.append(time.perf_counter() - start)
        assert answer == {"reply": {"n": 1}}, answer
    connection.close()


def measure(port, callers, calls):
    times = []
    threads = [threading.Thread(target=caller, args=(port, calls, times)) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    times.sort()
    return statistics.median(times) * 1000, times[int(len(times) * 0.99) - 1] * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per caller")
    args = parser.parse_args()
    programs = {"toa.py": start(COMPONENT), "raw": start(RAW)}
    try:
        for callers in (1, 16):
            result = {}
            for name, (_, port) in programs.items():
                measure(port, 1, 20)  # warm-up
                result[name] = measure(port, callers, args.calls)
            (p50, p99), (raw50, raw99) = result["toa.py"], result["raw"]
            print(f"{callers:2} caller(s): toa.py p50 {p50:.2f} ms p99 {p99:.2f} ms; "
                  f"raw p50 {raw50:.2f} ms p99 {raw99:.2f} ms; p50 ratio {p50 / raw50:.2f}x")
    finally:
        for process, _ in programs.values():
            process.kill()


if __name__ == "__main__":
    main()
