"""The wallet's credit (seed 003, "once does not help"): it accumulates and has nothing to be
keyed by, so it declares `once`; a transition that retries may not call it."""


def transition(input, entry):
    entry["balance"] += input["amount"]
    return {"balance": entry["balance"]}
