def computation(input, context):
    return context.state.drained
