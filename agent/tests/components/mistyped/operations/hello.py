def computation(input, context):
    return {"hello": True}
