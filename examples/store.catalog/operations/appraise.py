# The seed's appraise: ten a minute per customer, counted across every replica.
from toa import Error

COST = 6_000  # one request is worth 6 seconds: ten per minute
WINDOW = 60_000


def effect(input, context):
    [debt] = context.atom.meter([f"appraise:{input['customer']}"], [COST])
    if debt > WINDOW:
        return Error("TOO_MANY_REQUESTS")
    return {"product": input["product"], "price": 100 + len(input["product"])}
