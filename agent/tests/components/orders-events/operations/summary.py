"""An order's status and total."""


def observation(input, entry, context):
    return {"status": entry.status, "total": entry.total}
