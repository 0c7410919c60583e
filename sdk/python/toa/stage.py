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

from __future__ import annotations

import http.client
import json
import os
import secrets
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Dict, Iterable, Literal, Mapping, Optional, Tuple, Type, Union

from . import protocol
from .agent import refusal
from .errors import CallError, Error
from .protocol import CallRequest, Halt, Outcome, Route

READY_WITHIN = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _request(port: int, method: str, path: str, body: Optional[Mapping[str, Any]] = None,
             headers: Optional[Dict[str, str]] = None, timeout: float = 120) -> Tuple[int, Any]:
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
    def __init__(self, process: subprocess.Popen[bytes], port: int, control: int, token: str,
                 log: Path) -> None:
        self.process = process
        self.port = port
        self.address = f"http://127.0.0.1:{port}"
        self._control = control
        self._token = token
        self._log = log
        self._halts = 0

    def output(self) -> str:
        """What the agent and the programs printed."""
        return Path(self._log).read_text(errors="replace")

    def _ready(self) -> Stage:
        deadline = time.monotonic() + READY_WITHIN
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"toa-agent exited ({self.process.returncode}) before it was ready:\n{self.output()}")
            try:
                if _request(self.port, protocol.READYZ.method, protocol.READYZ.path, timeout=1)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.process.kill()
        raise RuntimeError(f"toa-agent was not ready within {READY_WITHIN} s:\n{self.output()}")

    def call(self, target: str, request: Optional[CallRequest] = None) -> Any:
        """Calls `component.operation`: the reply, or the operation's own `Error`; a failed call
        raises `CallError`."""
        component, operation = target.rsplit(".", 1)
        route = protocol.CALL
        body: CallRequest = {"input": None, **(request or {})}
        status, answer = _request(self.port, route.method, route.at(component=component, operation=operation), body)
        if status >= 400:
            raise CallError(refusal(answer, status))
        value: Outcome = answer
        if "error" in value:
            return Error(value["error"]["code"], value["error"].get("message"))
        return value["reply"]

    def _controlled(self, route: Route, halt: str) -> None:
        body: Halt = {"halt": halt}
        status, value = _request(self._control, route.method, route.path, body,
                                 {"authorization": f"Bearer {self._token}"})
        if status != 200:
            raise RuntimeError(f"{route.path.rsplit('/', 1)[-1]} answered {status}: {value}")

    def halt(self) -> None:
        """Runs `pause` in every component (a halt)."""
        self._halts += 1
        self._controlled(protocol.HALT, f"stage-{self._halts}")

    def restore(self) -> None:
        """Runs `resume`: the same processes, with their state."""
        self._controlled(protocol.RESUME, f"stage-{self._halts}")

    def stop(self, within: float = 60) -> int:
        """Drains (dispose runs) and waits for the agent to exit; its exit code."""
        if self.process.poll() is None:
            try:
                _request(self.port, protocol.DRAIN.method, protocol.DRAIN.path)
            except OSError:
                self.process.terminate()
        try:
            return self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], error: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> Literal[False]:
        self.stop()
        return False


def compose(components: Iterable[Union[str, Path]], context: Union[str, Path, None] = None,
            environment: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
            agent: Optional[str] = None) -> Stage:
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
