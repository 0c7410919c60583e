def request(payload):
    return {"input": payload}
