# A component calls its own operation through context.local, another's through context.remote.
from toa import CallError


def computation(input, context):
    price = context.local.appraise({"input": {"customer": input["customer"]}})
    try:
        context.remote.shop.nobody.anything({"input": {}})
        refused = None
    except CallError as error:
        refused = error.name
    return {"price": price, "refused": refused}
