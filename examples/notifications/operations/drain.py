# The seed's drain: every replica gets the pulse and drains its share of 16 partitions.


def effect(input, context):
    slots = context.atom.slots(16)
    if slots is None:
        return None  # owns nothing now: do nothing
    for partition in slots:
        context.state.drained[partition] = context.state.drained.get(partition, 0) + 1
    return slots
