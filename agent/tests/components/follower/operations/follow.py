"""Keeps an order's status as of the event it is given, and the versions it stored."""


def transition(input, entry, context):
    entry["status"] = input["status"]
    entry["seen"] = list(entry.seen) + [input["version"]]
    return entry
