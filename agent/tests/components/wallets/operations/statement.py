"""An observation with a module: given the object (or None), never writes."""


def observation(input, entry, context):
    if entry is None:
        return {"known": False}
    return {"known": True, "balance": entry.balance, "version": entry.VERSION}
