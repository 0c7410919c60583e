def computation(input, context):
    return None
