# components/fulfilment.stock/operations/reserve.py
from toa import Error


def transition(input, entry):
    if entry.available < input["quantity"]:
        return Error("OUT_OF_STOCK")

    entry.available -= input["quantity"]

    return entry
