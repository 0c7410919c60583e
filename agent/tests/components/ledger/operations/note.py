"""Appends the order and version it is given to $TEST_RECORD; fails while $TEST_FAIL exists."""

import json
import os


def effect(input, context):
    if os.path.exists(os.environ["TEST_FAIL"]):
        raise RuntimeError("note fails while TEST_FAIL exists")
    with open(os.environ["TEST_RECORD"], "a") as out:
        out.write(json.dumps(input) + "\n")
    return None
