# components/store.orders/operations/approve.py
from toa import Error


def transition(input, entry, context):
    if entry.status == "approved":
        entry.DISCARD = True  # asked again: it is approved already

        return entry

    if entry.status != "pending":
        return Error("NOT_PENDING")

    # made on every attempt
    debit = context.remote.billing.wallets.debit({
        "query": {"id": entry.customer},
        "input": {"amount": entry.total, "ref": entry.id},
    })

    if isinstance(debit, Error):
        return debit

    entry.status = "approved"

    return entry
