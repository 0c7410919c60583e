# Records its run commands and ticks (component, pid, time) to the file in $TEST_RECORD.
# HALTER_PREFLIGHT_MS: how long preflight takes; HALTER_PAUSE_MS: how long pause takes;
# HALTER_FAIL_PAUSE: the component whose pause fails.
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))
from toa import Component  # noqa: E402

component = Component()
NAME = os.environ["TOA_COMPONENT"]


def record(event):
    with open(os.environ["TEST_RECORD"], "a") as out:
        out.write(json.dumps({"event": event, "component": NAME, "pid": os.getpid(), "at": time.time()}) + "\n")


@component.lifecycle
def preflight(context):
    time.sleep(int(os.environ.get("HALTER_PREFLIGHT_MS", "0")) / 1000)
    record("preflight")


@component.lifecycle
def pause(context):
    time.sleep(int(os.environ.get("HALTER_PAUSE_MS", "0")) / 1000)
    fail = os.environ.get("HALTER_FAIL_PAUSE")
    if fail and NAME.endswith(fail):
        record("pause-failed")
        raise RuntimeError("cannot pause: a batch is half written")
    record("pause")


@component.lifecycle
def resume(context):
    record("resume")


@component.lifecycle
def dispose(context):
    record("dispose")


@component.operation
def tick(input, context):
    record("tick")


component.run()
