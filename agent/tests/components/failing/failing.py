import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))
from toa import Component  # noqa: E402

component = Component()


@component.lifecycle
def preflight(context):
    raise RuntimeError("cannot reach the mail provider")


component.run()
