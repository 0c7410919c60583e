# Records run commands and pulse ticks (with its pid) to the file in $TEST_RECORD.
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))
from toa import Component  # noqa: E402

component = Component()


def record(event):
    with open(os.environ["TEST_RECORD"], "a") as out:
        out.write(json.dumps({"event": event, "pid": os.getpid(), "at": time.monotonic()}) + "\n")


@component.lifecycle
def preflight(context):
    context.state["polling"] = True
    record("preflight")


@component.lifecycle
def pause(context):
    context.state["polling"] = False
    record("pause")


@component.lifecycle
def resume(context):
    context.state["polling"] = True
    record("resume")


@component.lifecycle
def dispose(context):
    record("dispose")


@component.operation
def tick(input, context):
    record("tick")


@component.operation
def ping(input, context):
    return "pong"


component.run()
