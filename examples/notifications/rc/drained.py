# How often this process drained each partition, kept in its context.state.


def preflight(context):
    context.state.drained = {}
