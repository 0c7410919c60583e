# The seed's settle: the nightly settlement never runs twice at the same time.
import time


def effect(input, context):
    def settle(signal):
        batch = ["order-1", "order-2"]  # collect
        time.sleep(0.2)
        if signal.aborted:
            raise RuntimeError("the lock was lost: not submitting")
        context.state.settlements.append(signal.token)  # submit, fenced by the token
        return {"submitted": len(batch), "token": signal.token}

    return context.atom.lock("settlement", settle)
