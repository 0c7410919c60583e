# components/billing.wallets/operations/debit.py
from toa import Error


def transition(input, entry):
    if entry.paid.get(input["ref"]) is not None:
        entry.DISCARD = True  # asked again for the same thing: the money is taken

        return {"balance": entry.balance}

    if entry.balance < input["amount"]:
        return Error("INSUFFICIENT_FUNDS")

    entry.balance -= input["amount"]
    entry.paid[input["ref"]] = input["amount"]

    return {"balance": entry.balance}
