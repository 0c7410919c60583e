"""Moves the whole balance to another wallet by calling its `credit` from a transition that
retries: what seed 003 says not to do. The agent refuses the call; the refusal is returned."""

from toa import CallError


def transition(input, entry, context):
    try:
        context.remote.billing.wallets.credit({"query": {"id": input["to"]}, "input": {"amount": entry["balance"]}})
    except CallError as error:
        entry["DISCARD"] = True
        return {"refused": f"{error.name}: {error}"}
    entry["balance"] = 0
    return entry
