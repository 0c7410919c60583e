# A component calls its own operation through context.local, another's through context.remote,
# and sends a task (discard=True), whose run it waits for here (at most 5 s).
import time

from toa import CallError


def computation(input, context):
    price = context.local.appraise({"input": {"customer": input["customer"]}})
    try:
        context.remote.shop.nobody.anything({"input": {}})
        refused = None
    except CallError as error:
        refused = error.name
    task = context.local.remember({"input": {"n": 7}}, discard=True)
    deadline = time.monotonic() + 5
    while 7 not in context.state.get("remembered", []) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"price": price, "refused": refused, "task": task, "task_ran": 7 in context.state.get("remembered", [])}
