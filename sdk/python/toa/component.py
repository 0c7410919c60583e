"""Components in one file, with decorators: the older style of `examples/python/toa.py`, kept for
programs written that way, on the SDK's own client and protocol handler.

    from toa import Component, Error

    component = Component()

    @component.operation
    def appraise(input, context):
        [debt] = context.agent.meter([f"appraise:{input['customer']}"], [6000])
        if debt > 60000:
            return Error("TOO_MANY_REQUESTS")
        return {"price": 42}

    component.run()

The manifest lists the run commands (`lifecycle`): such a program does not describe itself
(`GET /program` is not served), as before.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, List, Optional, Sequence, TypeVar, Union

from . import protocol, runtime
from .agent import Agent, Signal
from .context import Atom, Context
from .protocol import Assignment, CallRequest, Description, Query, Route, TaskRequest

Function = TypeVar("Function", bound=Callable[..., Any])


class Helper:
    """`context.agent`: the local API in the decorator style."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._atom = Atom(agent)

    def meter(self, keys: Union[str, Sequence[str]], deltas: Union[int, Sequence[int]]) -> List[int]:
        return self._atom.meter(keys, deltas)

    def slots(self, total: int) -> Optional[List[int]]:
        return self._atom.slots(total)

    def onassigned(self, listener: Callable[[Optional[Assignment]], Any]) -> Callable[[], None]:
        return self._atom.onassigned(listener)

    def lock(self, keys: Union[str, Sequence[str]]) -> contextlib.AbstractContextManager[Signal]:
        """`with context.agent.lock("k") as lock:`: `lock.token`, and `lock.lost` once lost."""
        return self._agent.hold(keys)

    def call(self, target: str, input: Any = None, instance: Optional[str] = None,
             timeout: Optional[int] = None, key: Optional[str] = None,
             query: Optional[Query] = None) -> Any:
        """`target` is `namespace.component.operation`: the reply or an `Error`. `key`: an
        idempotency key (a repeat gets the first call's outcome without running again). `query`:
        the object an operation of a component with an entity works on."""
        body: CallRequest = {"input": input}
        if query is not None:
            body["query"] = query
        if instance is not None:
            body["instance"] = instance
        if timeout is not None:
            body["timeout"] = timeout
        if key is not None:
            body["key"] = key
        return self._call(protocol.CALL, target, body)

    def task(self, target: str, input: Any = None, key: Optional[str] = None,
             query: Optional[Query] = None) -> Any:
        """A call the caller does not wait for: returns once the broker took it."""
        body: TaskRequest = {"input": input}
        if query is not None:
            body["query"] = query
        if key is not None:
            body["key"] = key
        return self._call(protocol.TASK, target, body)

    def _call(self, route: Route, target: str, body: Union[CallRequest, TaskRequest]) -> Any:
        component, operation = target.rsplit(".", 1)
        return self._agent.call(route, component, operation, body)


class Component(runtime.Component):
    def __init__(self) -> None:
        super().__init__({}, {}, Context())
        self.context.agent = Helper(self.context._agent)  # type: ignore[attr-defined] # this style's own

    def operation(self, function: Function) -> Function:
        self.operations[function.__name__] = function
        return function

    def lifecycle(self, function: Function) -> Function:
        """Registers a run command named after the function: preflight, settle, ready, ..."""
        self.commands[function.__name__] = [function]
        return function

    def description(self) -> Optional[Description]:
        return None

    def run(self) -> None:
        runtime.serve(self)
