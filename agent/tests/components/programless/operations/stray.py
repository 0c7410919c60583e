def effect(input, context):
    return None
