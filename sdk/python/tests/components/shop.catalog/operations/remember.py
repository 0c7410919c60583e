# What a task ran with, kept for `quote` to see.


def effect(input, context):
    context.state.setdefault("remembered", []).append(input["n"])
