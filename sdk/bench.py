#!/usr/bin/env python3
"""Per-call overhead of each SDK over a raw HTTP handler in the same language, and the memory of
an idle component process: a benchmark, not a test.

    python3 sdk/bench.py [--calls N]

Starts programs the way the agent starts one (TOA_PORT, TOA_AGENT, TOA_COMPONENT): for Python, a
component in the seeds' layout (`operations/echo.py`, `python3 -m toa`) and the same operation
answered by a bare `BaseHTTPRequestHandler` that writes its answer in one piece; for TypeScript,
a component with `operations/echo.ts` run by `toa-node` (sdk/typescript, after `npm ci` there) and
the same operation answered by a bare `node:http` server. Sends `POST /operations/echo` to each,
as the agent does (one keep-alive connection per caller), with one caller and with 16, and prints
the p50 and p99 of each and the ratio SDK / raw per language, then each program's resident memory
(VmRSS, with its children) once idle. The numbers go in docs/benchmarks.md.
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
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

PYTHON_ECHO = "def computation(input, context):\n    return input\n"
TYPESCRIPT_ECHO = "export function computation (input: unknown) { return input }\n"

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

RAW_NODE = """
const http = require('node:http')
http.createServer({ noDelay: true }, (request, response) => {
  const chunks = []
  request.on('data', (chunk) => chunks.push(chunk))
  request.on('end', () => {
    const body = JSON.stringify({ reply: JSON.parse(Buffer.concat(chunks)).input })
    response.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
    response.end(body)
  })
}).listen(Number(process.env.TOA_PORT), '127.0.0.1')
"""


def component(source, file):
    """A component directory holding `operations/<file>` with `source`."""
    directory = Path(tempfile.mkdtemp(prefix="toa-bench-"))
    (directory / "operations").mkdir()
    (directory / "operations" / file).write_text(source)
    return directory


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command, cwd=None):
    port = free_port()
    env = dict(os.environ, TOA_PORT=str(port), TOA_AGENT="http://127.0.0.1:1",
               TOA_COMPONENT="bench.echo", PYTHONPATH=str(HERE / "python"))
    process = subprocess.Popen(command, env=env, cwd=cwd)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, port
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise SystemExit(f"{command} did not serve {port}")
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


def rss_kib(pid):
    """The resident memory of `pid` and its children (tsx's esbuild service is one)."""
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total += int(line.split()[1])
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += rss_kib(int(child))
    return total


def programs():
    """(language, name) → the command and directory of each program."""
    toa_node = HERE / "typescript" / "bin" / "toa-node.js"
    found = {
        ("python", "sdk"): ([sys.executable, "-m", "toa"], component(PYTHON_ECHO, "echo.py")),
        ("python", "raw"): ([sys.executable, "-c", RAW], None),
    }
    if (HERE / "typescript" / "node_modules").is_dir():
        found[("typescript", "sdk")] = (["node", str(toa_node)], component(TYPESCRIPT_ECHO, "echo.ts"))
        found[("typescript", "raw")] = (["node", "-e", RAW_NODE], None)
    else:
        print("typescript: skipped (run `npm ci` in sdk/typescript)")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per caller")
    args = parser.parse_args()
    running = {key: start(command, cwd) for key, (command, cwd) in programs().items()}
    try:
        for callers in (1, 16):
            result = {}
            for key, (_, port) in running.items():
                measure(port, 1, 50)  # warm-up
                result[key] = measure(port, callers, args.calls)
            for language in sorted({language for language, _ in running}):
                (p50, p99), (raw50, raw99) = result[(language, "sdk")], result[(language, "raw")]
                print(f"{language:10} {callers:2} caller(s): SDK p50 {p50:.2f} ms p99 {p99:.2f} ms; "
                      f"raw p50 {raw50:.2f} ms p99 {raw99:.2f} ms; p50 ratio {p50 / raw50:.2f}x")
        time.sleep(2)  # idle: what the process keeps, not what a burst left in flight
        for (language, name), (process, _) in running.items():
            print(f"{language:10} {name}: idle RSS {rss_kib(process.pid) / 1024:.1f} MiB")
    finally:
        for process, _ in running.values():
            process.kill()


if __name__ == "__main__":
    main()
