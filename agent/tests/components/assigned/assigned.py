# Listens to its assignments with toa.py's onassigned from preflight, recording each to the file in
# $TEST_RECORD with the time (CLOCK_MONOTONIC, comparable across processes); dispose turns the listener off.
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))
from toa import Component  # noqa: E402

component = Component()


def record(event, **details):
    with open(os.environ["TEST_RECORD"], "a") as out:
        out.write(json.dumps({"event": event, "at": time.monotonic(), **details}) + "\n")


@component.lifecycle
def preflight(context):
    context.state["off"] = context.agent.onassigned(lambda assignment: record("assigned", assignment=assignment))


@component.lifecycle
def dispose(context):
    context.state["off"]()
    record("off")


component.run()
