"""The component's program: loads `operations/*.py` and `rc/*.py` from the component's directory
(the directory the program starts in), refuses to start when a module is not what it should be,
and serves the agent's protocol on 127.0.0.1:$TOA_PORT:

- `GET /program`: `{"commands": [...], "operations": [...], "kinds": {...}}`, what the modules
  export (`kinds`: each operation's function name, `transition` and so on); the agent
  checks it against the manifest (every declared operation has a module; the run commands it
  lists, if it lists any, are the ones exported) and runs the exported run commands;
- `POST /lifecycle/<command>`: every module's function of that name, in the modules' order;
- `POST /operations/<name>`: the module's function, with `input` (and, in a component with an
  entity, a transition's or an observation's `entry`) and the context. A transition answers the
  entry as it left it and what it returned (nothing when it returned the entry itself);
- `POST /receivers/<label>`: `request(payload)` of `receivers/<label>.py` (seed 001's adaptation
  of an event to its receiver's request: `input`, `query`, `instance`);
- `POST /conditions`: `condition(entry, previous)` of every `events/<name>.py`, for a write about
  to be stored: the names of the events whose condition holds, which the write publishes.
"""

from __future__ import annotations

import hmac
import importlib.util
import inspect
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union, cast

from . import protocol
from .agent import read_token
from .context import Context, State, call_function
from .errors import Error
from .protocol import (AdaptRequest, Adaptation, Adapted, CallInfo, ConditionsRequest, Decision,
                       Description, OperationRequest, Publish)

Operations = Dict[str, Callable[..., Any]]
Commands = Dict[str, List[Callable[..., Any]]]
Kinds = Dict[str, str]
Receivers = Dict[str, Callable[..., Any]]
Conditions = Dict[str, Callable[..., Any]]

COMMANDS = ("preflight", "settle", "ready", "pause", "resume", "dispose")
KINDS = ("effect", "computation", "transition", "observation", "assignment")


def _positional(function: Callable[..., Any]) -> int:
    """How many positional arguments `function` takes (3 for `*args`)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 3
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return 3
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)


# No `entry` in the request: the function is called without one.
ABSENT: Any = object()


class Refused(Exception):
    """A component that must not start, and why."""


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"toa_component_{path.parent.name}_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(directory: Union[str, Path]) -> Tuple[Operations, Commands, Kinds]:
    """The operations (name → function), run commands (name → functions) and the operations'
    kinds (name → the function's name) of the component in `directory`."""
    directory = Path(directory)
    operations: Operations = {}
    kinds_of: Kinds = {}
    for path in sorted((directory / "operations").glob("*.py")):
        module = _module(path)
        kinds = [kind for kind in KINDS if callable(getattr(module, kind, None))]
        if len(kinds) != 1:
            raise Refused(
                f"operations/{path.name}: expected one function named {' or '.join(KINDS)}, "
                f"found {kinds or 'none'}"
            )
        operations[path.stem] = getattr(module, kinds[0])
        kinds_of[path.stem] = kinds[0]
    commands: Commands = {}
    for path in sorted((directory / "rc").glob("*.py")):
        module = _module(path)
        exported = [name for name in COMMANDS if callable(getattr(module, name, None))]
        if not exported:
            raise Refused(f"rc/{path.name}: a module exports at least one of {', '.join(COMMANDS)}")
        for name in exported:
            commands.setdefault(name, []).append(getattr(module, name))
    if "pause" in commands and "resume" not in commands:
        raise Refused("rc/ exports `pause` and no `resume`: resume takes again what pause released")
    return operations, commands, kinds_of


def _exported(directory: Union[str, Path], folder: str, name: str,
              signature: str) -> Dict[str, Callable[..., Any]]:
    """The function `name` each module of `directory/folder` exports, by the module's name (an
    event's label for receivers/, its name for events/)."""
    functions: Dict[str, Callable[..., Any]] = {}
    for path in sorted(Path(directory, folder).glob("*.py")):
        function = getattr(_module(path), name, None)
        if not callable(function):
            raise Refused(f"{folder}/{path.name}: expected a function named {signature}")
        functions[path.stem] = function
    return functions


def load_receivers(directory: Union[str, Path]) -> Receivers:
    """The adaptations of received events (label → `request`): `receivers/<label>.py`, each
    exporting `request(payload)`."""
    return _exported(directory, "receivers", "request", "request(payload)")


def load_conditions(directory: Union[str, Path]) -> Conditions:
    """The conditions of the entity's events (name → `condition`): `events/<name>.py`, each
    exporting `condition(entry, previous)`."""
    return _exported(directory, "events", "condition", "condition(entry, previous)")


class Component:
    def __init__(self, operations: Operations, commands: Commands, context: Context,
                 kinds: Optional[Kinds] = None, receivers: Optional[Receivers] = None,
                 conditions: Optional[Conditions] = None) -> None:
        self.operations = operations
        self.commands = commands
        self.context = context
        self.kinds = kinds or {}
        self.receivers = receivers or {}
        self.conditions = conditions or {}

    def description(self) -> Optional[Description]:
        description: Description = {
            "commands": [name for name in COMMANDS if name in self.commands],
            "operations": sorted(self.operations),
            "kinds": dict(self.kinds),
        }
        if self.receivers:
            description["receivers"] = sorted(self.receivers)
        if self.conditions:
            description["conditions"] = sorted(self.conditions)
        return description

    def publish(self, entry: Dict[str, Any], previous: Optional[Dict[str, Any]]) -> Publish:
        """The events whose condition holds for a write that stores `entry` over `previous`
        (`None`: there was none). A condition answers True or False; anything else fails the
        write (a condition that forgot to return would otherwise never publish)."""
        publish = []
        before = State(previous) if isinstance(previous, dict) else previous
        for name, condition in sorted(self.conditions.items()):
            holds = condition(State(entry), before)
            if not isinstance(holds, bool):
                raise TypeError(f"events/{name}.py: condition returned {type(holds).__name__}, "
                                "expected True or False")
            if holds:
                publish.append(name)
        return {"publish": publish}

    def adapt(self, label: str, payload: Any) -> Adaptation:
        """The request the event makes: what `request(payload)` returns, passed as it is (the
        agent dead-letters an event whose request is not a dict of input, query and instance:
        another delivery would make the same)."""
        return {"request": cast(Adapted, call_function(self.receivers[label], payload))}

    def run_command(self, name: str) -> None:
        self.context._calls.call = None
        self.context._calls.trace = None
        for function in self.commands.get(name, []):
            call_function(function, self.context)

    def operate(self, name: str, input: Any, call: Optional[CallInfo] = None,
                entry: Any = ABSENT, trace: Optional[dict[str, str]] = None) -> Decision:
        """`{"reply": ...}` or the operation's own `{"error": ...}`; an exception is a failure.
        `call` is what the agent says of the call (`context.call` on this thread). With an
        `entry` (a component with an entity) the function is given it before the context, and a
        transition answers the entry as it left it too. `trace`: the request's trace context
        headers, which the calls the operation makes pass on."""
        self.context._calls.call = call
        self.context._calls.trace = trace
        try:
            return self._operate(name, input, entry)
        finally:
            # The thread serves other requests after this one (the agent keeps its connections):
            # a run command there has no call, and names none on the calls it makes.
            self.context._calls.call = None
            self.context._calls.trace = None

    def _operate(self, name: str, input: Any, entry: Any) -> Decision:
        function = self.operations[name]
        if entry is ABSENT:
            result = call_function(function, input, self.context)
        else:
            entry = State(entry) if isinstance(entry, dict) else entry
            # As the seeds write them: `def transition(input, entry)` takes no context.
            args = (input, entry, self.context)[:max(2, _positional(function))]
            result = call_function(function, *args)
        if isinstance(result, Error):
            return {"error": {"code": result.code, "message": result.message}}
        if self.kinds.get(name) != "transition" or entry is None or entry is ABSENT:
            return {"reply": result}
        # The entry itself returned: the agent answers the stored object, with its new VERSION.
        if result is entry:
            return {"entry": entry}
        return {"entry": entry, "reply": result}


PAST_DEADLINE = "the call's deadline passed before the operation started; it did not run"


def past_deadline(call: Any) -> bool:
    """Whether the caller has stopped waiting (`deadline_ms`, ms since the epoch): it was answered
    `Abandoned` at its deadline, so the operation must not start after it. Checked right before the
    operation, after the hand-off from the agent, which takes time of its own."""
    deadline = call.get("deadline_ms") if isinstance(call, dict) else None
    return isinstance(deadline, int) and time.time() * 1000 >= deadline


def handler(component: Component) -> Type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go in two writes: with Nagle's algorithm the second would wait for
        # the agent's delayed ACK of the first, ~40 ms on every answer.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, value: Any) -> None:
            # Status line, headers and body in one write: no Date or Server header to format,
            # and nothing for Nagle's algorithm to hold back.
            body = json.dumps(value).encode()
            head = (f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}\r\n"
                    f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n")
            self.wfile.write(head.encode() + body)

        def _from_the_agent(self) -> bool:
            """Whether the request carries the component's token, as the agent's do; a program
            that knows no token (started by hand) takes every request. Refused: 401, and the
            connection closed (its body is not read)."""
            expected = read_token(os.environ.get("TOA_AGENT_TOKEN"),
                                  os.environ.get("TOA_AGENT_TOKEN_FILE"))
            given = self.headers.get("authorization") or ""
            if expected is None or hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
                return True
            self.close_connection = True
            self._answer(401, {"message": "only the agent asks this program: its requests carry "
                                          "the component's token (Authorization: Bearer)"})
            return False

        def do_GET(self) -> None:
            if not self._from_the_agent():
                return
            description = component.description()
            if self.path == protocol.PROGRAM.path and description is not None:
                return self._answer(200, description)
            return self._answer(404, {"message": f"no route {self.path}"})

        def do_POST(self) -> None:
            if not self._from_the_agent():
                return
            length = int(self.headers.get("content-length") or 0)
            request: OperationRequest = json.loads(self.rfile.read(length) or b"{}")
            kind, _, name = self.path.strip("/").partition("/")
            try:
                if kind == "lifecycle" and name in COMMANDS:
                    component.run_command(name)
                    return self._answer(200, {})
                if kind == "receivers" and name in component.receivers:
                    payload = cast(AdaptRequest, request).get("payload")
                    return self._answer(200, component.adapt(name, payload))
                if self.path == protocol.CONDITIONS.path and component.conditions:
                    asked = cast(ConditionsRequest, request)
                    return self._answer(200, component.publish(asked["entry"], asked.get("previous")))
                if kind == "operations" and name in component.operations:
                    if past_deadline(request.get("call")):
                        return self._answer(504, {"message": PAST_DEADLINE})
                    entry = request["entry"] if "entry" in request else ABSENT
                    trace = {header: value for header in protocol.TRACE_HEADERS
                             if (value := self.headers.get(header))}
                    answer = component.operate(name, request.get("input"), request.get("call"), entry,
                                               trace)
                    return self._answer(200, answer)
                # Not an `error` body: the agent would take it for an operation's own error.
                return self._answer(404, {"message": f"no route {self.path}"})
            except Exception as exception:  # noqa: BLE001 - the agent reports it with the name
                print(f"{os.environ.get('TOA_COMPONENT')}: {kind} {name} failed: {exception!r}",
                      file=sys.stderr, flush=True)
                return self._answer(500, {"message": failure(kind, exception)})

    return Handler


def failure(kind: str, exception: Exception) -> str:
    """What a failure is called in its answer, which the agent logs and passes on. A receiver's
    adaptation and a condition hold an event's data, which the message may quote: the type
    only (the program's own log above has the whole)."""
    if kind in ("receivers", "conditions"):
        return f"{type(exception).__name__} (its message is in the program's log)"
    return repr(exception)


def serve(component: Component) -> None:
    """Serves the agent's protocol for `component` on 127.0.0.1:$TOA_PORT until stopped."""
    # The agent stops the program with SIGTERM, after `dispose`. Ctrl-C on `toa-agent compose`
    # reaches the program too (one process group): it is the agent's to act on, so that the
    # program is still there for `dispose`.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["TOA_PORT"])), handler(component))
    server.daemon_threads = True
    threading.current_thread().name = "toa-runtime"
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


def main() -> None:
    """The component in the current directory: its modules loaded, then served. Its own modules
    beside operations/ and rc/ can be imported (the directory is on the path)."""
    sys.path.insert(0, str(Path.cwd()))
    name = os.environ.get("TOA_COMPONENT", Path.cwd().name)
    try:
        if not os.environ.get("TOA_PORT", "").isdigit():
            raise Refused(f"TOA_PORT: expected the port to serve on, got {os.environ.get('TOA_PORT')!r}: "
                          "a component's program is started by toa-agent, which sets it")
        operations, commands, kinds = load(Path.cwd())
        receivers = load_receivers(Path.cwd())
        conditions = load_conditions(Path.cwd())
        context = Context()
    except (Refused, RuntimeError, ValueError) as refused:
        print(f"{name}: {refused}", file=sys.stderr)
        sys.exit(1)
    serve(Component(operations, commands, context, kinds, receivers, conditions))


if __name__ == "__main__":
    main()
