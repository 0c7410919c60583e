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

from . import runtime
from .context import Atom, Context


class Helper:
    """`context.agent`: the local API in the decorator style."""

    def __init__(self, agent):
        self._agent = agent
        self._atom = Atom(agent)

    def meter(self, keys, deltas):
        return self._atom.meter(keys, deltas)

    def slots(self, total):
        return self._atom.slots(total)

    def onassigned(self, listener):
        return self._atom.onassigned(listener)

    def lock(self, keys):
        """`with context.agent.lock("k") as lock:`: `lock.token`, and `lock.lost` once lost."""
        return self._agent.hold(keys)

    def call(self, target, input=None, instance=None, timeout=None, key=None):
        """`target` is `namespace.component.operation`: the reply or an `Error`. `key`: an
        idempotency key (a repeat gets the first call's outcome without running again)."""
        return self._call("call", target, input, instance, timeout, key)

    def task(self, target, input=None, key=None):
        """A call the caller does not wait for: returns once the broker took it."""
        return self._call("task", target, input, None, None, key)

    def _call(self, kind, target, input, instance, timeout, key):
        component, operation = target.rsplit(".", 1)
        body = {"input": input}
        for name, value in (("instance", instance), ("timeout", timeout), ("key", key)):
            if value is not None:
                body[name] = value
        return self._agent.call(kind, component, operation, body)


class Component(runtime.Component):
    def __init__(self):
        super().__init__({}, {}, Context())
        self.context.agent = Helper(self.context._agent)

    def operation(self, function):
        self.operations[function.__name__] = function
        return function

    def lifecycle(self, function):
        """Registers a run command named after the function: preflight, settle, ready, ..."""
        self.commands[function.__name__] = [function]
        return function

    def description(self):
        return None

    def run(self):
        runtime.serve(self)
