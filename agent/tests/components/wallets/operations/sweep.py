"""Moves the whole balance to another wallet by calling its `credit` from a transition that
retries: what seed 003 says not to do. The agent refuses the call; the refusal is returned."""

from toa import CallError


def transition(input, entry, context):
    try:
        request = {"query": {"id": input["to"]}, "input": {"amount": entry["balance"]}}
        if input.get("key"):
            # The same on every run: applied once by it, so the agent lets it through.
            request["key"] = input["key"]
        context.remote.billing.wallets.credit(request)
    except CallError as error:
        entry["DISCARD"] = True
        return {"refused": f"{error.name}: {error}"}
    entry["balance"] = 0
    return entry
