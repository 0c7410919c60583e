import threading


def computation(input, context):
    first = threading.Event()
    seen = []

    def listener(assignment):
        seen.append(assignment)
        first.set()

    off = context.atom.onassigned(listener)
    first.wait(5)
    off()
    return {"started": context.state.get("started"), "slots": context.atom.slots(16),
            "instance": context.instance, "assigned": seen[:1],
            "configuration": context.configuration, "call": context.call}
