"""Published by the write that approves an order, not by its later changes."""


def condition(entry, previous):
    if entry.get("total") == 13:
        raise ValueError("13 is refused by this condition")
    return entry.get("status") == "approved" and (previous is None or previous.status != "approved")
