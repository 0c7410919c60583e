# The stash, one step at a time: `get`, `set` or `delete`, and what it answered or raised.
from toa import CallError


def computation(input, context):
    try:
        if input["op"] == "set":
            done = context.stash.set(input["key"], input["value"], input["ttl"])
        else:
            done = getattr(context.stash, input["op"])(input["key"])
        return {"done": done}
    except CallError as error:
        return {"error": {"code": error.code, "message": str(error)}}
