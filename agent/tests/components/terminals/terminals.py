# Records each charge (amount, pid, when it ran) to the file in $TEST_RECORD (and that it started,
# to $TEST_CHARGE_STARTS if set), and each note to $TEST_NOTES. TERMINALS_DISPOSE_MS: how long dispose takes.
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))
from toa import Component, Error  # noqa: E402

component = Component()


@component.lifecycle
def preflight(context):
    context.state["connections"] = set()


@component.operation
def connect(input, context):
    context.state["connections"].add(input["terminal"])
    return {"holder": context.instance}


@component.operation
def charge(input, context):
    if input["terminal"] not in context.state["connections"]:
        return Error("NOT_HELD")
    started = time.time()
    if os.environ.get("TEST_CHARGE_STARTS"):
        with open(os.environ["TEST_CHARGE_STARTS"], "a") as out:
            out.write(json.dumps({"amount": input["amount"], "pid": os.getpid(), "at": started}) + "\n")
    time.sleep(input.get("sleep_ms", 0) / 1000)
    record = {"amount": input["amount"], "pid": os.getpid(), "started": started, "ended": time.time()}
    with open(os.environ["TEST_RECORD"], "a") as out:
        out.write(json.dumps(record) + "\n")
    return {"charged": input["amount"]}


@component.lifecycle
def dispose(context):
    time.sleep(int(os.environ.get("TERMINALS_DISPOSE_MS", "0")) / 1000)


@component.operation
def note(input, context):
    # An ordinary call that records where and when it ran, to $TEST_NOTES (and that it started, to
    # $TEST_NOTE_STARTS if set).
    started = time.time()
    if os.environ.get("TEST_NOTE_STARTS"):
        with open(os.environ["TEST_NOTE_STARTS"], "a") as out:
            out.write(json.dumps({"id": input["id"], "pid": os.getpid()}) + "\n")
    if input.get("fail"):
        raise RuntimeError("asked to fail")
    if input.get("crash"):
        os._exit(3)
    time.sleep(input.get("sleep_ms", 0) / 1000)
    record = {"id": input["id"], "pid": os.getpid(), "started": started, "ended": time.time()}
    with open(os.environ["TEST_NOTES"], "a") as out:
        out.write(json.dumps(record) + "\n")
    return {"pid": os.getpid()}


@component.operation
def pid(input, context):
    return os.getpid()


component.run()
