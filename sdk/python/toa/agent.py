"""The agent's local API (docs/component-protocol.md), for one component: the requests the context
makes. Standard library only; the component's token (TOA_AGENT_TOKEN, or the file
TOA_AGENT_TOKEN_FILE names, read for each request) goes with every request."""

import contextlib
import http.client
import json
import os
import socket
import threading
import urllib.parse

from .errors import CallError, Error


class Agent:
    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        if not environ.get("TOA_AGENT") or not environ.get("TOA_COMPONENT"):
            raise RuntimeError(
                "expected TOA_AGENT (the agent's local API, e.g. http://127.0.0.1:7090) and "
                "TOA_COMPONENT: a component's program is started by toa-agent, which sets them")
        url = urllib.parse.urlparse(environ["TOA_AGENT"])
        self.host, self.port = url.hostname, url.port
        self.component = environ["TOA_COMPONENT"]
        self.instance = environ.get("TOA_INSTANCE", "")
        self._token = environ.get("TOA_AGENT_TOKEN")
        self._token_file = environ.get("TOA_AGENT_TOKEN_FILE")

    def headers(self):
        headers = {"content-type": "application/json"}
        token = self._token
        if token is None and self._token_file:
            with open(self._token_file) as file:
                token = file.read().strip()
        if token:
            headers["authorization"] = f"Bearer {token}"
        return headers

    def connect(self, timeout=None):
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def request(self, method, path, body=None, timeout=120):
        """The answer's status and JSON value; `CallError` `UNAVAILABLE` when the agent does not
        answer."""
        try:
            connection = self.connect(timeout)
        except OSError as error:
            raise CallError({"code": "UNAVAILABLE", "message": f"the agent did not answer: {error}"}) from error
        try:
            payload = None if body is None else json.dumps(body)
            connection.request(method, path, payload, self.headers())
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"null")
        except OSError as error:
            raise CallError({"code": "UNAVAILABLE", "message": f"the agent did not answer: {error}"}) from error
        finally:
            connection.close()

    def checked(self, method, path, body=None):
        status, value = self.request(method, path, body)
        if status >= 400:
            raise CallError((value or {}).get("error", {"code": str(status)}))
        return value

    def stream(self, method, path, body=None, timeout=None):
        """An open stream (newline-delimited JSON): the connection and the response. `timeout`:
        how long a read may wait (the agent writes a line at least every second)."""
        connection = self.connect(timeout)
        payload = None if body is None else json.dumps(body)
        connection.request(method, path, payload, self.headers())
        response = connection.getresponse()
        if response.status != 200:
            error = json.loads(response.read() or b"{}").get("error", {})
            connection.close()
            raise CallError(error)
        return connection, response

    def own(self, route):
        return f"/v1/{self.component}/{route}"

    @contextlib.contextmanager
    def hold(self, keys):
        """Holds the lock on `keys` (a key or a list) for the `with` block, waiting as long as it
        takes; yields its `Signal`. Leaving the block releases it."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        connection, response = self.stream("POST", self.own("lock"), {"keys": keys})
        try:
            signal = None
            for line in response:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("event") == "acquired":
                    signal = Signal(event["token"])
                    break
                raise CallError({"code": "LOCK", "message": event.get("message", str(event))})
            if signal is None:
                raise CallError({"code": "LOCK", "message": "the agent closed the lock stream"})
            threading.Thread(target=signal.watch, args=(response,), daemon=True).start()
            yield signal
        finally:
            # Closing the request releases the lock.
            connection.close()

    def call(self, kind, component, operation, body):
        """A call (`kind` "call") or a task ("task"): the reply, or the operation's own `Error`;
        a call that failed as a call raises `CallError`."""
        status, value = self.request("POST", f"/v1/{kind}/{component}/{operation}", body)
        if status >= 400:
            raise CallError((value or {}).get("error", {"code": str(status)}))
        if "error" in value:
            return Error(value["error"]["code"], value["error"].get("message"))
        return value["reply"]


class Signal:
    """A held lock's signal: `aborted` (also `lost`) turns true when the lock is lost (its holder
    must stop touching what it guards); `token` is the fencing token, larger for every later
    holder."""

    def __init__(self, token):
        self.token = token
        self._lost = threading.Event()

    @property
    def aborted(self):
        return self._lost.is_set()

    lost = aborted

    def wait(self, timeout=None):
        """Waits until the lock is lost, at most `timeout` seconds; whether it was."""
        return self._lost.wait(timeout)

    def watch(self, response):
        """Reads the lock's stream until it ends, setting `aborted` on `lost`."""
        try:
            for line in response:
                if line.strip() and json.loads(line).get("event") == "lost":
                    self._lost.set()
        except Exception:  # noqa: BLE001 - the stream ends when the lock is released
            pass
