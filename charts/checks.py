"""What the chart's test scripts share: each check a function run and counted, a summary."""

from __future__ import annotations

import sys
import traceback

results = {"passed": 0, "failed": 0}


def check(name):
    """Runs the decorated function as one test, counting it."""

    def run(function):
        try:
            function()
        except Exception:  # noqa: BLE001 - every failure is reported and counted
            results["failed"] += 1
            print(f"FAIL {name}")
            traceback.print_exc(file=sys.stdout)
        else:
            results["passed"] += 1
            print(f"ok   {name}")
        return function

    return run
