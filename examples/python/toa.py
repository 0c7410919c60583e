"""A component in Python, on the standard library only: the agent's protocol both ways.

    from toa import Component, Error

    component = Component()

    @component.operation
    def appraise(input, context):
        [debt] = context.agent.meter([f"appraise:{input['customer']}"], [6000])
        if debt > 60000:
            return Error("TOO_MANY_REQUESTS")
        return {"price": 42}

    component.run()

The agent starts the program with TOA_PORT (serve HTTP there, on 127.0.0.1), TOA_AGENT (its local
API), TOA_COMPONENT, TOA_INSTANCE and the component's token for its routes on the local API
(TOA_AGENT_TOKEN, or in a pod the file TOA_AGENT_TOKEN_FILE names). See
docs/component-protocol.md.
"""

import http.client
import json
import os
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Error:
    """An operation's own error, answered as {"error": {"code": ...}}."""

    def __init__(self, code, message=None):
        self.code = code
        self.message = message


class CallError(Exception):
    """A call that failed as a call: RequestContract (202), Addressee (403), Abandoned (404)..."""

    def __init__(self, error):
        super().__init__(error.get("message") or error.get("code"))
        self.code = error.get("number") or error.get("code")
        self.name = error.get("code")


class Lock:
    """A held lock: `token` is the fencing token, `lost` turns true when the lock was lost."""

    def __init__(self, connection, response, token):
        self.connection = connection
        self.response = response
        self.token = token
        self.lost = False
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        try:
            for line in self.response:
                if line.strip() and json.loads(line).get("event") == "lost":
                    self.lost = True
        except Exception:  # the stream ends when the lock is released
            pass

    def release(self):
        # Closing the request releases the lock.
        self.connection.close()


class Agent:
    """The agent's local API, for this component."""

    def __init__(self):
        url = urllib.parse.urlparse(os.environ["TOA_AGENT"])
        self.host, self.port = url.hostname, url.port
        self.component = os.environ["TOA_COMPONENT"]
        self.instance = os.environ.get("TOA_INSTANCE", "")

    def _headers(self):
        """The component's token (read each time: a restarted agent may write a new one)."""
        headers = {"content-type": "application/json"}
        token = os.environ.get("TOA_AGENT_TOKEN")
        path = os.environ.get("TOA_AGENT_TOKEN_FILE")
        if token is None and path:
            with open(path) as file:
                token = file.read().strip()
        if token:
            headers["authorization"] = f"Bearer {token}"
        return headers

    def _request(self, method, path, body=None):
        connection = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            payload = None if body is None else json.dumps(body)
            connection.request(method, path, payload, self._headers())
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            connection.close()

    def _checked(self, method, path, body=None):
        status, value = self._request(method, path, body)
        if status >= 400 or (isinstance(value, dict) and "error" in value and "reply" not in value and status != 200):
            raise CallError(value.get("error", {}))
        return value

    def meter(self, keys, deltas):
        return self._checked("POST", f"/v1/{self.component}/meter", {"keys": keys, "deltas": deltas})["debts"]

    def slots(self, total):
        return self._checked("GET", f"/v1/{self.component}/slots?total={int(total)}")["slots"]

    def onassigned(self, listener):
        """Calls `listener(assignment)` (`{"i", "n", "epoch"}` or None) at once and on every change,
        on a thread of its own; returns `off`, which removes the listener. A listener that raises
        tells the agent, and this replica owns no slots from then on."""
        connection = http.client.HTTPConnection(self.host, self.port)
        connection.request("GET", f"/v1/{self.component}/onassigned", headers=self._headers())
        response = connection.getresponse()
        if response.status != 200:
            error = json.loads(response.read()).get("error", {})
            connection.close()
            raise CallError(error)

        def watch():
            try:
                for line in response:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    try:
                        listener(event.get("assignment"))
                    except Exception:  # noqa: BLE001 - the agent takes the slots back
                        self._request("POST", f"/v1/{self.component}/onassigned/{event['listener']}/failed")
                        return
            except Exception:  # the stream ends when `off` closes it
                pass

        threading.Thread(target=watch, daemon=True).start()
        return connection.close

    def lock(self, keys):
        """Waits as long as it takes; returns a Lock. Use as `with agent.lock(["k"]) as lock:`."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        connection = http.client.HTTPConnection(self.host, self.port)
        connection.request("POST", f"/v1/{self.component}/lock", json.dumps({"keys": keys}),
                           self._headers())
        response = connection.getresponse()
        if response.status != 200:
            error = json.loads(response.read()).get("error", {})
            connection.close()
            raise CallError(error)
        for line in response:
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("event") == "acquired":
                return _Held(Lock(connection, response, event["token"]))
            connection.close()
            raise CallError({"code": "LOCK", "message": event.get("message", str(event))})
        connection.close()
        raise CallError({"code": "LOCK", "message": "the agent closed the lock stream"})

    def call(self, target, input=None, instance=None, timeout=None, key=None):
        """`target` is `namespace.component.operation`; returns the reply or an Error. `key`: an
        idempotency key (a repeat gets the first call's outcome without running again)."""
        return self._call("call", target, input, instance, timeout, key)

    def task(self, target, input=None, key=None):
        """A call the caller does not wait for: returns once the broker took it."""
        return self._call("task", target, input, None, None, key)

    def _call(self, kind, target, input, instance, timeout, key):
        component, operation = target.rsplit(".", 1)
        body = {"input": input}
        if instance is not None:
            body["instance"] = instance
        if timeout is not None:
            body["timeout"] = timeout
        if key is not None:
            body["key"] = key
        status, value = self._request("POST", f"/v1/{kind}/{component}/{operation}", body)
        if status >= 400:
            raise CallError(value.get("error", {}))
        if "error" in value:
            return Error(value["error"]["code"], value["error"].get("message"))
        return value["reply"]


class _Held:
    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        return self.lock

    def __exit__(self, *exc):
        self.lock.release()
        return False


class Context:
    def __init__(self):
        self.agent = Agent()
        self.instance = self.agent.instance
        self.state = {}
        self._local = threading.local()

    @property
    def call(self):
        """The call being answered on this thread: {"id", "redelivered", "deadline_ms"}."""
        return getattr(self._local, "call", None)


class Component:
    def __init__(self):
        self.operations = {}
        self.commands = {}
        self.context = Context()

    def operation(self, function):
        self.operations[function.__name__] = function
        return function

    def lifecycle(self, function):
        """Registers a run command named after the function: preflight, settle, ready, ..."""
        self.commands[function.__name__] = function
        return function

    def run(self):
        component = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The headers and the body go out in two writes: with Nagle's algorithm the second
            # waits for the agent's delayed ACK of the first, ~40 ms on every answer.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def _answer(self, status, value):
                body = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                kind, _, name = self.path.strip("/").partition("/")
                try:
                    if kind == "lifecycle" and name in component.commands:
                        component.commands[name](component.context)
                        return self._answer(200, {})
                    if kind == "operations" and name in component.operations:
                        component.context._local.call = request.get("call")
                        result = component.operations[name](request.get("input"), component.context)
                        if isinstance(result, Error):
                            return self._answer(200, {"error": {"code": result.code, "message": result.message}})
                        return self._answer(200, {"reply": result})
                    return self._answer(404, {"error": {"code": "NOT_FOUND", "message": self.path}})
                except Exception as exception:  # the agent reports it with the component's name
                    print(f"{os.environ.get('TOA_COMPONENT')}: {kind} {name} failed: {exception!r}", file=sys.stderr)
                    return self._answer(500, {"message": repr(exception)})

        server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["TOA_PORT"])), Handler)
        server.daemon_threads = True
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
