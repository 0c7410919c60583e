import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from toa import Component, Error  # noqa: E402

COST = 6_000  # one request is worth 6 seconds: ten per minute
WINDOW = 60_000

component = Component()


@component.operation
def appraise(input, context):
    [debt] = context.agent.meter([f"appraise:{input['customer']}"], [COST])
    if debt > WINDOW:
        return Error("TOO_MANY_REQUESTS")
    return {"product": input["product"], "price": 100 + len(input["product"])}


component.run()
