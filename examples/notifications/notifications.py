import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from toa import Component  # noqa: E402

component = Component()


@component.lifecycle
def preflight(context):
    context.state["drained"] = {}


@component.operation
def drain(input, context):
    slots = context.agent.slots(16)
    if slots is None:
        return None  # owns nothing now: do nothing
    for partition in slots:
        context.state["drained"][partition] = context.state["drained"].get(partition, 0) + 1
    return slots


@component.operation
def drained(input, context):
    return context.state["drained"]


component.run()
