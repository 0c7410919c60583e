"""The request an order's `noted` event makes of `note`: the order's id and version only."""


def request(payload):
    return {"input": {"order": payload["id"], "version": payload["VERSION"]}}
