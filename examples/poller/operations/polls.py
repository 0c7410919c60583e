def computation(input, context):
    return {"polls": context.state["polls"], "polling": "poller" in context.state}
