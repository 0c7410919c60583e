"""Keeps one object per event of an order it ran for: the order, its version and status."""


def transition(input, entry, context):
    entry["order"] = input["id"]
    entry["version"] = input["VERSION"]
    entry["status"] = input["status"]
    return entry
