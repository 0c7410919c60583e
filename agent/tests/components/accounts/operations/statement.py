"""An account as it is stored (a module, so that the program has one to serve)."""


def observation(input, entry, context):
    return entry
