"""Runs the component in the current directory with the Python SDK (sdk/python), for the examples'
manifests (`program: [python3, ../python/run.py]`): the same as `python3 -m toa` with the
SDK installed (`pip install ./sdk/python`), without installing it."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))

from toa.runtime import main  # noqa: E402

main()
