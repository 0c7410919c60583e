def adapt(payload):
    return {"input": payload}
