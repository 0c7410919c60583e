"""A stage for a component author's own tests (seed 001: "In a test, stage.halt() and
stage.restore() run pause and resume"): the real agent, `toa-agent compose`, on the author's
components, with its local API and control endpoint on free loopback ports.

    from toa.stage import compose

    with compose(["components/store.catalog"]) as stage:
        stage.call("store.catalog.appraise", {"input": {"customer": "c1", "product": "a1"}})
        stage.halt()      # pause runs in every component
        stage.restore()   # resume runs: the same processes, with their state
    # leaving the block drains the composition: dispose runs
"""

import http.client
import json
import os
import secrets
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .errors import CallError, Error

READY_WITHIN = 60


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port, method, path, body=None, headers=None, timeout=120):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, None if body is None else json.dumps(body),
                           {"content-type": "application/json", **(headers or {})})
        response = connection.getresponse()
        text = response.read()
        try:
            return response.status, json.loads(text or b"null")
        except ValueError:  # /readyz and /v1/drain answer text
            return response.status, text.decode(errors="replace")
    finally:
        connection.close()


class Stage:
    def __init__(self, process, port, control, token, log):
        self.process = process
        self.port = port
        self.address = f"http://127.0.0.1:{port}"
        self._control = control
        self._token = token
        self._log = log
        self._halts = 0

    def output(self):
        """What the agent and the programs printed."""
        return Path(self._log).read_text(errors="replace")

    def _ready(self):
        deadline = time.monotonic() + READY_WITHIN
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"toa-agent exited ({self.process.returncode}) before it was ready:\n{self.output()}")
            try:
                if _request(self.port, "GET", "/readyz", timeout=1)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.process.kill()
        raise RuntimeError(f"toa-agent was not ready within {READY_WITHIN} s:\n{self.output()}")

    def call(self, target, request=None):
        """Calls `component.operation`: the reply, or the operation's own `Error`; a failed call
        raises `CallError`."""
        component, operation = target.rsplit(".", 1)
        status, value = _request(self.port, "POST", f"/v1/call/{component}/{operation}",
                                 {"input": None, **(request or {})})
        if status >= 400:
            raise CallError((value or {}).get("error", {"code": str(status)}))
        if "error" in value:
            return Error(value["error"]["code"], value["error"].get("message"))
        return value["reply"]

    def _controlled(self, route, halt):
        status, value = _request(self._control, "POST", f"/control/{route}", {"halt": halt},
                                 {"authorization": f"Bearer {self._token}"})
        if status != 200:
            raise RuntimeError(f"{route} answered {status}: {value}")

    def halt(self):
        """Runs `pause` in every component (a halt)."""
        self._halts += 1
        self._controlled("halt", f"stage-{self._halts}")

    def restore(self):
        """Runs `resume`: the same processes, with their state."""
        self._controlled("resume", f"stage-{self._halts}")

    def stop(self, within=60):
        """Drains (dispose runs) and waits for the agent to exit; its exit code."""
        if self.process.poll() is None:
            try:
                _request(self.port, "POST", "/v1/drain")
            except OSError:
                self.process.terminate()
        try:
            return self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def compose(components, context=None, environment=None, env=None, agent=None):
    """Starts `toa-agent compose` on `components` (directories) and returns the `Stage` once every
    component is ready. `agent`: the binary ($TOA_AGENT_BIN, else `toa-agent` on PATH)."""
    binary = agent or os.environ.get("TOA_AGENT_BIN") or "toa-agent"
    port, control = _free_port(), _free_port()
    token = secrets.token_hex(24)
    scratch = Path(tempfile.mkdtemp(prefix="toa-stage-"))
    (scratch / "token").write_text(token)
    (scratch / "token").chmod(0o600)
    args = [binary, "compose", *map(str, components), "--listen", f"127.0.0.1:{port}",
            "--control-listen", f"127.0.0.1:{control}", "--control-token-file", str(scratch / "token")]
    if context:
        args += ["--context", str(context)]
    if environment:
        args += ["--environment", environment]
    log = scratch / "output"
    with open(log, "wb") as out:
        process = subprocess.Popen(args, env={**os.environ, **(env or {})},
                                   stdout=out, stderr=subprocess.STDOUT)
    return Stage(process, port, control, token, log)._ready()
