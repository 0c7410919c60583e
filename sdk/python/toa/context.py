"""The `context` every operation and run command gets, with the seeds' members:

- `context.instance`: this process's name;
- `context.state`: one plain object per process, shared by run commands and operations
  (`context.state.mailer = ...`, or as a dict);
- `context.configuration`: the component's configuration (`TOA_CONFIGURATION`, JSON; `{}` without),
  its secrets (`"$NAME"`) in place from `TOA_SECRET_NAME`;
- `context.atom.lock(keys, fn)`, `slots(total)`, `onassigned(listener)`, `meter(keys, deltas)`;
- `context.local.<operation>(request, timeout=...)` and
  `context.remote.<namespace>.<component>.<operation>(request, timeout=...)`, where `request` is
  `{"input": ..., "instance": ..., "query": ..., "key": ...}` as in the seeds (`key`: an
  idempotency key; any other field is refused, naming it); a failed call raises `CallError`;
  `discard=True` sends a task, which returns None once the broker took it;
- `context.call`: the call the running operation answers (`id`, `redelivered`, `deadline_ms`);
- `context.stash.get(key)`, `set(key, value, ttl)`, `delete(key)`: what every replica should see.
"""

from __future__ import annotations

import asyncio
import http.client
import inspect
import json
import os
import re
import sys
import threading
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import protocol
from .agent import Agent, Signal  # noqa: F401 - Signal is the SDK's too
from .errors import CallError
from .protocol import (AssignedEvent, Assignment, CallInfo, CallRequest, MeterRequest, MeterResponse, SlotsResponse,
                       StashDeleted, StashRequest, StashValue)


def call_function(function: Callable[..., Any], *args: Any) -> Any:
    """Runs `function` (plain or `async def`) on this thread and returns its result."""
    if inspect.iscoroutinefunction(function):
        return asyncio.run(function(*args))
    return function(*args)


class State(Dict[str, Any]):
    """A plain object: its keys are attributes too."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None


class Atom:
    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def lock(self, keys: Union[str, Sequence[str]], function: Callable[[Signal], Any]) -> Any:
        """Holds `keys` (a key or a list) while `function(signal)` runs, waiting as long as it
        takes; returns what it returns. The lock goes when it returns or raises."""
        with self._agent.hold(keys) as signal:
            return call_function(function, signal)

    def slots(self, total: int) -> Optional[List[int]]:
        """This replica's share of `total` slots, or None while it owns none for sure."""
        route = protocol.SLOTS
        answer: SlotsResponse = self._agent.checked(route.method, self._agent.own(route) + f"?total={int(total)}")
        return answer["slots"]

    def meter(self, keys: Union[str, Sequence[str]], deltas: Union[int, Sequence[int]]) -> List[int]:
        """Charges `deltas` to `keys` across replicas; each key's debt after the charge."""
        body: MeterRequest = {
            "keys": [keys] if isinstance(keys, str) else list(keys),
            "deltas": [deltas] if isinstance(deltas, (int, float)) else list(deltas),
        }
        answer: MeterResponse = self._agent.checked(protocol.METER.method, self._agent.own(protocol.METER), body)
        return answer["debts"]

    def onassigned(self, listener: Callable[[Optional[Assignment]], Any]) -> Callable[[], None]:
        """Calls `listener(assignment)` at once and on every change, on a thread of its own;
        returns `off`. A listener that raises gives this replica's slots to the others. When
        the stream ends or falls silent (an agent container restarted, say), the listener hears
        `None` and the stream is opened again."""
        return Listening(self._agent, listener).off


# The agent writes a line at least every second: this long without one, the stream is stuck.
SILENCE = 2.0


class Listening:
    """One `onassigned` listener on its own stream, followed on a thread of its own."""

    def __init__(self, agent: Agent, listener: Callable[[Optional[Assignment]], Any]) -> None:
        self._agent = agent
        self._listener = listener
        self._told: object = object()
        self._done = threading.Event()
        self._connection: Optional[http.client.HTTPConnection] = None
        threading.Thread(target=self._follow, daemon=True).start()

    def off(self) -> None:
        self._done.set()
        if self._connection is not None:
            self._connection.close()

    def _tell(self, assignment: Optional[Assignment], listener_id: Optional[int] = None) -> bool:
        """Calls the listener if `assignment` differs from the last one told; False once it
        raised (the agent was told, while the stream is still open)."""
        if self._done.is_set() or assignment == self._told:
            return True
        self._told = assignment
        try:
            self._listener(assignment)
            return True
        except Exception as error:  # noqa: BLE001 - the agent takes the slots back
            print(f"{self._agent.component}: an onassigned listener raised, this replica owns "
                  f"nothing from now on: {error!r}", file=sys.stderr, flush=True)
            if listener_id is not None:
                route = protocol.FAILED
                self._agent.request(route.method, self._agent.own(route, listener=listener_id))
            self._done.set()
            return False

    def _follow(self) -> None:
        route = protocol.ONASSIGNED
        while not self._done.is_set():
            try:
                self._connection, response = self._agent.stream(
                    route.method, self._agent.own(route), timeout=SILENCE)
                if self._done.is_set():
                    break
                for line in response:
                    if not line.strip():
                        continue
                    event: AssignedEvent = json.loads(line)
                    if not self._tell(event.get("assignment"), event.get("listener")):
                        break
            except Exception:  # noqa: BLE001 - ended, silent, refused or closed by `off`
                pass
            finally:
                if self._connection is not None:
                    self._connection.close()
            self._tell(None)
            self._done.wait(0.5)


class Stash:
    """What every replica of the component should see (seed 001), kept for a time to live the
    caller gives (ms, at most 30 days) on the first atomicity server (in-process locally without
    one); not what must survive, which belongs in the entity."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def _path(self, key: str) -> str:
        return self._agent.own(protocol.STASH_GET, key=urllib.parse.quote(key, safe=""))

    def get(self, key: str) -> Any:
        """The value under `key`, or None."""
        answer: StashValue = self._agent.checked(protocol.STASH_GET.method, self._path(key))
        return answer.get("value")

    def set(self, key: str, value: Any, ttl: int) -> None:
        """Keeps `value` (JSON, at most 1 MiB) under `key` for `ttl` ms, replacing what was there."""
        body: StashRequest = {"value": value, "ttl": ttl}
        self._agent.checked(protocol.STASH_SET.method, self._path(key), body)

    def delete(self, key: str) -> bool:
        """Removes `key`; whether a value was kept."""
        answer: StashDeleted = self._agent.checked(protocol.STASH_DELETE.method, self._path(key))
        return answer["deleted"]


class Calls:
    """`context.remote.<a>.<b>...(request, timeout=None)`: the last name is the operation, the
    ones before it the component's full name."""

    def __init__(self, agent: Agent, path: Tuple[str, ...] = ()) -> None:
        self._agent = agent
        self._path = path

    def __getattr__(self, name: str) -> Calls:
        if name.startswith("_"):
            raise AttributeError(name)
        return Calls(self._agent, self._path + (name,))

    def __call__(self, request: Optional[Mapping[str, Any]] = None, timeout: Optional[int] = None,
                 discard: bool = False) -> Any:
        """The reply, or the operation's own `Error`; with `discard=True` a task (seed 002's
        `{ discard: true }`), which returns None once the broker took it."""
        if len(self._path) < 2:
            raise AttributeError(f"{'.'.join(self._path)}: name a component, then an operation")
        *component, operation = self._path
        request = dict(request or {})
        unknown = [field for field in request if field not in REQUEST]
        if unknown:
            raise CallError({"code": "RequestContract", "number": 202, "message": "; ".join(
                f"{'.'.join(self._path)}: unknown request field `{field}` (known: {', '.join(REQUEST)})"
                for field in unknown)})
        body: CallRequest = {"input": request.get("input")}
        if request.get("instance") is not None:
            body["instance"] = request["instance"]
        if request.get("query") is not None:
            body["query"] = request["query"]
        if request.get("key") is not None:
            body["key"] = request["key"]
        if timeout is not None:
            body["timeout"] = timeout
        route = protocol.TASK if discard else protocol.CALL
        return self._agent.call(route, ".".join(component), operation, body)


# The fields a request may have: any other is refused, naming it, before anything is sent (the
# agent refuses it too, as do `toa-agent call` and the other SDK).
REQUEST = ("input", "instance", "query", "key")


# A string "$NAME" in the configuration is the place of a secret, whose value comes as
# TOA_SECRET_NAME (docs/context.md, "Secrets").
SECRET = re.compile(r"\$([A-Z][A-Z0-9_]*)")


def reveal(value: Any, environ: Mapping[str, str], at: str = "") -> Any:
    """`value` with every secret in place; raises naming one without a value, never a value."""
    if isinstance(value, str):
        match = SECRET.fullmatch(value)
        if match is None:
            return value
        name = match.group(1)
        secret = environ.get(f"TOA_SECRET_{name}")
        if secret is None:
            raise RuntimeError(f"TOA_CONFIGURATION{at}: the secret ${name} has no value: TOA_SECRET_{name} is not set")
        return secret
    if isinstance(value, list):
        return [reveal(item, environ, f"{at}/{index}") for index, item in enumerate(value)]
    if isinstance(value, dict):
        return {key: reveal(item, environ, f"{at}/{key}") for key, item in value.items()}
    return value


class Context:
    def __init__(self, environ: Optional[Mapping[str, str]] = None) -> None:
        environ = os.environ if environ is None else environ
        self._agent = Agent(environ)
        self.instance = self._agent.instance
        self.state = State()
        try:
            configuration = json.loads(environ.get("TOA_CONFIGURATION") or "{}")
        except ValueError as error:
            raise RuntimeError(f"TOA_CONFIGURATION: expected the component's configuration as JSON: {error}") from error
        self.configuration: Any = reveal(configuration, environ)
        self.atom = Atom(self._agent)
        self.stash = Stash(self._agent)
        self.remote = Calls(self._agent)
        self.local = Calls(self._agent, (self._agent.component,))
        self._calls = self._agent.running

    @property
    def call(self) -> Optional[CallInfo]:
        """The call being answered on this thread: `{"id", "redelivered", "deadline_ms"}`
        (docs/component-protocol.md), or None in a run command."""
        call: Optional[CallInfo] = getattr(self._calls, "call", None)
        return call
