def computation(input, context):
    return context.state.settlements
