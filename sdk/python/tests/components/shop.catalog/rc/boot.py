# Run commands from rc/: the manifest lists none, the agent runs what this module exports.
import os


def preflight(context):
    context.state.started = True


def dispose(context):
    record = os.environ.get("TEST_RECORD")
    if record:
        with open(record, "a") as file:
            file.write("dispose\n")
