# The settlements this process submitted, kept in its context.state.


def preflight(context):
    context.state.settlements = []


def dispose(context):
    print(f"store.orders: disposed after {len(context.state.settlements)} settlements", flush=True)
