"""The `context` every operation and run command gets, with the seeds' members:

- `context.instance`: this process's name;
- `context.state`: one plain object per process, shared by run commands and operations
  (`context.state.mailer = ...`, or as a dict);
- `context.configuration`: the component's configuration (`TOA_CONFIGURATION`, JSON; `{}` without);
- `context.atom.lock(keys, fn)`, `slots(total)`, `onassigned(listener)`, `meter(keys, deltas)`;
- `context.local.<operation>(request, timeout=...)` and
  `context.remote.<namespace>.<component>.<operation>(request, timeout=...)`, where `request` is
  `{"input": ..., "instance": ...}` as in the seeds; a failed call raises `CallError`.
"""

import asyncio
import inspect
import json
import os
import threading

from .agent import Agent, Signal  # noqa: F401 - Signal is the SDK's too


def call_function(function, *args):
    """Runs `function` (plain or `async def`) on this thread and returns its result."""
    if inspect.iscoroutinefunction(function):
        return asyncio.run(function(*args))
    return function(*args)


class State(dict):
    """A plain object: its keys are attributes too."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value

    def __delattr__(self, name):
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None


class Atom:
    def __init__(self, agent):
        self._agent = agent

    def lock(self, keys, function):
        """Holds `keys` (a key or a list) while `function(signal)` runs, waiting as long as it
        takes; returns what it returns. The lock goes when it returns or raises."""
        with self._agent.hold(keys) as signal:
            return call_function(function, signal)

    def slots(self, total):
        """This replica's share of `total` slots, or None while it owns none for sure."""
        return self._agent.checked("GET", self._agent.own(f"slots?total={int(total)}"))["slots"]

    def meter(self, keys, deltas):
        """Charges `deltas` to `keys` across replicas; each key's debt after the charge."""
        body = {"keys": list(keys), "deltas": list(deltas)}
        return self._agent.checked("POST", self._agent.own("meter"), body)["debts"]

    def onassigned(self, listener):
        """Calls `listener(assignment)` at once and on every change, on a thread of its own;
        returns `off`. A listener that raises gives this replica's slots to the others."""
        connection, response = self._agent.stream("GET", self._agent.own("onassigned"))
        agent = self._agent

        def watch():
            try:
                for line in response:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    try:
                        listener(event.get("assignment"))
                    except Exception:  # noqa: BLE001 - the agent takes the slots back
                        agent.request("POST", agent.own(f"onassigned/{event['listener']}/failed"))
                        return
            except Exception:  # noqa: BLE001 - the stream ends when `off` closes it
                pass

        threading.Thread(target=watch, daemon=True).start()
        return connection.close


class Calls:
    """`context.remote.<a>.<b>...(request, timeout=None)`: the last name is the operation, the
    ones before it the component's full name."""

    def __init__(self, agent, path=()):
        self._agent = agent
        self._path = path

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return Calls(self._agent, self._path + (name,))

    def __call__(self, request=None, timeout=None):
        if len(self._path) < 2:
            raise AttributeError(f"{'.'.join(self._path)}: name a component, then an operation")
        *component, operation = self._path
        request = dict(request or {})
        body = {"input": request.get("input")}
        if request.get("instance") is not None:
            body["instance"] = request["instance"]
        if timeout is not None:
            body["timeout"] = timeout
        return self._agent.call("call", ".".join(component), operation, body)


class Context:
    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        self._agent = Agent(environ)
        self.instance = self._agent.instance
        self.state = State()
        self.configuration = json.loads(environ.get("TOA_CONFIGURATION") or "{}")
        self.atom = Atom(self._agent)
        self.remote = Calls(self._agent)
        self.local = Calls(self._agent, (self._agent.component,))
        self._calls = threading.local()

    @property
    def call(self):
        """The call being answered on this thread: `{"id", "redelivered", "deadline_ms"}`
        (docs/component-protocol.md), or None in a run command."""
        return getattr(self._calls, "call", None)
