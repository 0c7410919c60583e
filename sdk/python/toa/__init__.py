"""Components in Python, written the way the seed documents write them.

A component's directory holds `manifest.toa.yaml`, `operations/<name>.py` (each defining one of
`effect`, `computation`, `transition`, `observation`, `assignment`) and `rc/*.py` (run commands:
functions named `preflight`, `settle`, `ready`, `pause`, `resume`, `dispose`). The manifest's
`program` is `[python3, -m, toa]` (or `[toa-component]` once installed with
`pip install ./sdk/python`). Every function gets the component's `context`: see `toa.context`.
`toa.Component` is the older one-file style with decorators (`toa.component`).
"""

from .agent import Signal
from .component import Component
from .context import Context
from .errors import CallError, Error

__all__ = ["CallError", "Component", "Context", "Error", "Signal"]
