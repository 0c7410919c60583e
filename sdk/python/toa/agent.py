"""The agent's local API (docs/component-protocol.md), for one component: the requests the context
makes. Standard library only; the component's token (TOA_AGENT_TOKEN, or the file
TOA_AGENT_TOKEN_FILE names, read for each request) goes with every request."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import urllib.parse
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple, Union, cast

from . import protocol
from .errors import CallError, Error
from .protocol import CallRequest, ErrorBody, ErrorDetail, LockEvent, LockRequest, Outcome, Route, TaskRequest


def read_token(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    """The component's token: `token` (TOA_AGENT_TOKEN), else the file `token_file`
    (TOA_AGENT_TOKEN_FILE) names, read now (an agent container the kubelet restarted writes a new
    one); None without either. The agent's requests to the program carry it too."""
    if token is None and token_file:
        with open(token_file) as file:
            token = file.read().strip()
    return token or None


class Agent:
    def __init__(self, environ: Optional[Mapping[str, str]] = None) -> None:
        environ = os.environ if environ is None else environ
        if not environ.get("TOA_AGENT") or not environ.get("TOA_COMPONENT"):
            raise RuntimeError(
                "expected TOA_AGENT (the agent's local API, e.g. http://127.0.0.1:7090) and "
                "TOA_COMPONENT: a component's program is started by toa-agent, which sets them")
        url = urllib.parse.urlparse(environ["TOA_AGENT"])
        self.host: Optional[str] = url.hostname
        self.port: Optional[int] = url.port
        self.component = environ["TOA_COMPONENT"]
        self.instance = environ.get("TOA_INSTANCE", "")
        self._token = environ.get("TOA_AGENT_TOKEN")
        self._token_file = environ.get("TOA_AGENT_TOKEN_FILE")
        # The call each thread serves (`.call`, the agent's `{"id", ...}`): its id goes with every
        # call the operation makes (the `toa-call` header), so that the agent knows what makes it.
        # `.trace`: the W3C trace context headers the operation's request came with, passed on
        # with them so that those calls join its trace.
        self.running = threading.local()

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        token = read_token(self._token, self._token_file)
        if token:
            headers["authorization"] = f"Bearer {token}"
        return headers

    def connect(self, timeout: Optional[float] = None) -> http.client.HTTPConnection:
        connection = http.client.HTTPConnection(cast(str, self.host), self.port, timeout=timeout)
        connection.connect()
        cast(socket.socket, connection.sock).setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def request(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None,
                timeout: float = 120, headers: Optional[Mapping[str, str]] = None) -> Tuple[int, Any]:
        """The answer's status and JSON value; `CallError` `UNAVAILABLE` when the agent does not
        answer."""
        try:
            connection = self.connect(timeout)
        except OSError as error:
            raise CallError({"code": "UNAVAILABLE", "message": f"the agent did not answer: {error}"}) from error
        try:
            payload = None if body is None else json.dumps(body)
            connection.request(method, path, payload, {**self.headers(), **(headers or {})})
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"null")
        except OSError as error:
            raise CallError({"code": "UNAVAILABLE", "message": f"the agent did not answer: {error}"}) from error
        finally:
            connection.close()

    def checked(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> Any:
        status, value = self.request(method, path, body)
        if status >= 400:
            raise CallError(refusal(value, status))
        return value

    def stream(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None,
               timeout: Optional[float] = None, headers: Optional[Mapping[str, str]] = None,
               ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """An open stream (newline-delimited JSON): the connection and the response. `timeout`:
        how long a read may wait (the agent writes a line at least every second)."""
        connection = self.connect(timeout)
        payload = None if body is None else json.dumps(body)
        connection.request(method, path, payload, {**self.headers(), **(headers or {})})
        response = connection.getresponse()
        if response.status != 200:
            refused: ErrorBody = json.loads(response.read() or b"{}")
            error = refused.get("error", cast(ErrorDetail, {}))
            connection.close()
            raise CallError(error)
        return connection, response

    def made_in(self) -> Optional[dict[str, str]]:
        """The headers of a call or lock this thread's operation makes: the id of the call it
        answers and the trace context it was given, if it answers one."""
        headers = dict(getattr(self.running, "trace", None) or {})
        running = getattr(self.running, "call", None)
        made_in = running.get("id") if isinstance(running, dict) else None
        if isinstance(made_in, str):
            headers[protocol.CALL_HEADER] = made_in
        return headers or None

    def own(self, route: Route, **parameters: object) -> str:
        """One of the component's own routes (`/v1/{component}/...`)."""
        return route.at(component=self.component, **parameters)

    @contextlib.contextmanager
    def hold(self, keys: Union[str, Sequence[str]]) -> Iterator[Signal]:
        """Holds the lock on `keys` (a key or a list) for the `with` block, waiting as long as it
        takes; yields its `Signal`. Leaving the block releases it."""
        body: LockRequest = {"keys": [keys] if isinstance(keys, str) else list(keys)}
        # Asked for in an operation: the agent waits for it only until the call's deadline, and
        # then answers DEADLINE (the caller is told the call failed; the block must not run).
        connection, response = self.stream(protocol.LOCK.method, self.own(protocol.LOCK), body,
                                           headers=self.made_in())
        try:
            signal = None
            for line in response:
                if not line.strip():
                    continue
                event: LockEvent = json.loads(line)
                if event.get("event") == "acquired":
                    signal = Signal(event["token"])
                    break
                raise CallError({"code": event.get("code", "LOCK"), "message": event.get("message", str(event))})
            if signal is None:
                raise CallError({"code": "LOCK", "message": "the agent closed the lock stream"})
            threading.Thread(target=signal.watch, args=(response,), daemon=True).start()
            yield signal
        finally:
            # Closing the request releases the lock.
            connection.close()

    def call(self, route: Route, component: str, operation: str,
             body: Union[CallRequest, TaskRequest]) -> Any:
        """A call (`route` CALL) or a task (TASK): the reply, or the operation's own `Error`;
        a call that failed as a call raises `CallError`."""
        path = route.at(component=component, operation=operation)
        status, answer = self.request(route.method, path, body, headers=self.made_in())
        if status >= 400:
            raise CallError(refusal(answer, status))
        value: Outcome = answer
        if "error" in value:
            return Error(value["error"]["code"], value["error"].get("message"))
        return value["reply"]


class Signal:
    """A held lock's signal: `aborted` (also `lost`) turns true when the lock is lost (its holder
    must stop touching what it guards); `token` is the fencing token, larger for every later
    holder."""

    def __init__(self, token: int) -> None:
        self.token = token
        self._lost = threading.Event()

    @property
    def aborted(self) -> bool:
        return self._lost.is_set()

    lost = aborted

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the lock is lost, at most `timeout` seconds; whether it was."""
        return self._lost.wait(timeout)

    def watch(self, response: http.client.HTTPResponse) -> None:
        """Reads the lock's stream until it ends, setting `aborted` on `lost`."""
        try:
            for line in response:
                if line.strip() and json.loads(line).get("event") == "lost":
                    self._lost.set()
        except Exception:  # noqa: BLE001 - the stream ends when the lock is released
            pass


def refusal(value: Any, status: int) -> ErrorDetail:
    """The agent's refusal in a 4xx or 5xx answer's body, or its status when it has none."""
    body: Optional[ErrorBody] = value
    otherwise: ErrorDetail = {"code": str(status)}
    return (body or {}).get("error", otherwise)
