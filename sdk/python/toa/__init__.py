"""Components in Python, written the way the seed documents write them.

A component's directory holds `manifest.toa.yaml`, `operations/<name>.py` (each defining one of
`effect`, `computation`, `transition`, `observation`, `assignment`) and `rc/*.py` (run commands:
functions named `preflight`, `settle`, `ready`, `pause`, `resume`, `dispose`). The manifest's
`program` is `[python3, -m, toa]` (or `[toa-component]` once installed with
`pip install ./sdk/python`). Every function gets the component's `context`: see `toa.context`.
"""

from .context import Context, Signal
from .errors import CallError, Error

__all__ = ["CallError", "Context", "Error", "Signal"]
