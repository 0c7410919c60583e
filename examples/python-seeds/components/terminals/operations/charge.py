# components/terminals/operations/charge.py
from toa import Error


def computation(input, context):
    connection = context.state.connections.get(input["terminal"])

    if connection is None:
        return Error("NOT_HELD")

    return connection.charge(input["amount"])
