# Work under the settlement's lock, after its holder: with $TEST_RECORD it records `ran`, or the
# lock's error code (DEADLINE: the call's deadline passed before the lock was taken).
import os

from toa import CallError


def record(line):
    with open(os.environ["TEST_RECORD"], "a") as file:
        file.write(line + "\n")


def effect(input, context):
    try:
        context.atom.lock("settlement", lambda signal: record("ran"))
    except CallError as error:
        record(str(error.code))
        raise
