# The seed's settle: the nightly settlement never runs twice at the same time.
import time


async def effect(input, context):
    def settle(signal):
        start = time.monotonic()
        time.sleep(0.2)
        if signal.aborted:
            raise RuntimeError("the lock was lost")
        return {"token": signal.token, "start": start, "end": time.monotonic()}

    return context.atom.lock("settlement", settle)
