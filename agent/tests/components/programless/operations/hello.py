def computation(input, context):
    return {"hello": input.get("name")}
