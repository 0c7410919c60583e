# The seed's settle: the nightly settlement never runs twice at the same time. `hold_ms` (200 by
# default) is how long it works under the lock; with $TEST_RECORD it records `held`.
import os
import time


async def effect(input, context):
    def settle(signal):
        start = time.monotonic()
        if os.environ.get("TEST_RECORD"):
            with open(os.environ["TEST_RECORD"], "a") as file:
                file.write("held\n")
        time.sleep((input or {}).get("hold_ms", 200) / 1000)
        if signal.aborted:
            raise RuntimeError("the lock was lost")
        return {"token": signal.token, "start": start, "end": time.monotonic()}

    return context.atom.lock("settlement", settle)
