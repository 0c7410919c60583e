# Records its run commands (with what it could do in each) to the file in $TEST_RECORD.
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
    time.sleep(0.2)  # operations are not served until preflight is done
    record("preflight")


@component.lifecycle
def settle(context):
    # The component can call its own operations now.
    record("settle", echo=context.agent.call("test.recorder.echo", {"from": "settle"}))


@component.lifecycle
def ready(context):
    record("ready", instance=context.instance)


@component.lifecycle
def dispose(context):
    # Nothing calls into it any more, but it can still call out: the agent refuses the call in.
    target = os.environ.get("RECORDER_DISPOSE_CALL")
    if target is None:
        record("dispose")
        return
    try:
        answer = context.agent.call(target, {"terminal": "from-dispose"})
    except Exception as error:  # noqa: BLE001 - recorded for the test to see
        answer = {"failed": str(error)}
    record("dispose", called=answer)


@component.operation
def echo(input, context):
    record("echo", input=input, call=context.call)
    return input


@component.operation
def events(input, context):
    return open(os.environ["TEST_RECORD"]).read()


component.run()
