# preflight takes half a second and records when it ran, to the file in $TEST_RECORD.
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))
from toa import Component  # noqa: E402

component = Component()


@component.lifecycle
def preflight(context):
    start = time.monotonic()
    time.sleep(0.5)
    with open(os.environ["TEST_RECORD"], "a") as out:
        out.write(json.dumps({"component": os.environ["TOA_COMPONENT"], "from": start, "to": time.monotonic()}) + "\n")


component.run()
