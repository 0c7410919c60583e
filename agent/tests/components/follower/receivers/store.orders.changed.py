"""An order's event follows the order: the same id, its status and version."""


def request(payload):
    return {
        "query": {"id": payload["id"]},
        "input": {"status": payload["status"], "version": payload["VERSION"]},
    }
