import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from toa import Component  # noqa: E402

component = Component()


@component.lifecycle
def preflight(context):
    context.state["settlements"] = []


@component.operation
def settle(input, context):
    with context.agent.lock("settlement") as lock:
        batch = ["order-1", "order-2"]  # collect
        time.sleep(0.2)
        if lock.lost:
            raise RuntimeError("the lock was lost: not submitting")
        context.state["settlements"].append(lock.token)  # submit, fenced by the token
        return {"submitted": len(batch), "token": lock.token}


@component.operation
def settled(input, context):
    return context.state["settlements"]


@component.lifecycle
def dispose(context):
    print(f"store.orders: disposed after {len(context.state['settlements'])} settlements", flush=True)


component.run()
