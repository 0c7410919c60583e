# components/terminals/rc/connections.py


def preflight(context):
    context.state.connections = {}


def dispose(context):
    for connection in context.state.connections.values():
        connection.close()
