"""Seed 003's reserve: the check and the write in one transition over the stock item."""

from toa import Error


def transition(input, entry, context):
    if entry.available < input["quantity"]:
        return Error("OUT_OF_STOCK")
    entry["available"] -= input["quantity"]
    return entry
