#!/usr/bin/env python3
"""Fuzzes the agent's local API and control endpoint with schemathesis against agent/openapi.yaml.

A real `toa-agent compose` (the seeds' examples, embedded coordination) serves both; schemathesis
sends generated requests, valid and not, to every route the agent serves that does not stream
forever or stop the composition, and fails on a 5xx, a status the file does not document for the
route, or a body that does not match it. The streams (`lock`, `onassigned`) and `/v1/drain` are
left to agent/tests/api.rs; the program's side (`/lifecycle`, `/operations`) is the program's.

Run by scripts/test after the Rust tests (which build the agent): up to 1,000 examples per route
(`--max-examples`; a route with fewer distinct inputs gets all of them), deterministic; 7,320 cases
in about 100 s on 2 cores (5,254 over 9 local routes, 2,066 over the 3 control routes).
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
AGENT = os.path.join(TARGET, "debug", "toa-agent")
SPEC = os.path.join(ROOT, "agent", "openapi.yaml")
EXAMPLES = int(os.environ.get("TOA_FUZZ_EXAMPLES", "1000"))
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(log_path, text, limit):
    deadline = time.time() + limit
    while time.time() < deadline:
        with open(log_path) as log:
            if text in log.read():
                return
        time.sleep(0.1)
    with open(log_path) as log:
        sys.exit(f"no {text!r} within {limit} s:\n{log.read()}")


def schemathesis(url, include, *extra):
    command = [
        "schemathesis", "run", SPEC,
        "--url", url,
        "--include-path-regex", include,
        "--checks", CHECKS,
        "--max-examples", str(EXAMPLES),
        "--request-timeout", "10",
        "--generation-deterministic",
        "--suppress-health-check", "all",
        *extra,
    ]
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT).returncode


def main():
    if not os.path.exists(AGENT):
        sys.exit(f"{AGENT} is missing: build the agent first (cargo build -p toa-agent)")
    local, control = free_port(), free_port()
    workdir = tempfile.mkdtemp(prefix="toa-fuzz-")
    token_file = os.path.join(workdir, "token")
    with open(token_file, "w") as f:
        f.write("fuzz-token")
    log_path = os.path.join(workdir, "agent.log")
    with open(log_path, "w") as log:
        agent = subprocess.Popen(
            [AGENT, "compose", "examples/store.catalog", "examples/store.orders",
             "--listen", f"127.0.0.1:{local}",
             "--control-listen", f"127.0.0.1:{control}",
             "--control-token-file", token_file],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
            env={**os.environ, "RUST_LOG": "warn,toa_agent=info"},
        )
    try:
        wait_for(log_path, "Composition complete", 60)
        local_routes = r"^/(v1/(call|task)/|v1/instance$|v1/\{component\}/(slots|meter)$|v1/\{component\}/onassigned/\{listener\}/failed$|healthz$|readyz$|metrics$)"
        failed = schemathesis(f"http://127.0.0.1:{local}", local_routes)
        # The control endpoint with the token (agents still take it as a bearer token): the
        # fuzzed bodies reach the handlers, not only the 401.
        failed |= schemathesis(
            f"http://127.0.0.1:{control}", r"^/control/",
            "--header", "Authorization: Bearer fuzz-token",
        )
        if agent.poll() is not None:
            with open(log_path) as log:
                sys.exit(f"the agent exited during the fuzzing:\n{log.read()}")
        if failed:
            with open(log_path) as log:
                print(log.read()[-4000:])
            sys.exit("schemathesis found responses the OpenAPI file does not allow")
        print("fuzzing: the local API and the control endpoint answered as documented")
    finally:
        agent.terminate()
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()


if __name__ == "__main__":
    main()
