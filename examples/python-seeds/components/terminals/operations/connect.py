# components/terminals/operations/connect.py
from stand_ins import open


def effect(input, context):
    context.state.connections[input["terminal"]] = open(input["address"])

    context.local.assign({
        "query": {"id": input["terminal"]},
        "input": {"holder": context.instance},
    })
