"""Seed 003's debit: the money for one `ref` is taken once, however often it is asked for."""


def transition(input, entry, context):
    if entry.paid.get(input["ref"]) is not None:
        entry["DISCARD"] = True  # asked again for the same thing: the money is taken
        return {"balance": entry.balance}
    if entry.balance < input["amount"]:
        from toa import Error
        return Error("INSUFFICIENT_FUNDS")
    entry["balance"] -= input["amount"]
    entry["paid"][input["ref"]] = input["amount"]
    return {"balance": entry["balance"]}
