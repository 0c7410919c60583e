"""Moves what overdrawn accounts owe from `balance` to `owed`, page by page through the
inherited `enumerate`, each with the version it read: a write made meanwhile by another call
wins (PRECONDITION_FAILED), and that account is counted as `skipped` for the next run."""


def effect(input, context):
    moved, skipped, after = 0, 0, None
    while True:
        page = {"limit": input.get("limit", 100)}
        if after is not None:
            page["after"] = after
        listed = context.local.enumerate({"input": page})
        for account in listed["items"]:
            if account["balance"] >= 0:
                continue
            query = {"id": account["id"], "version": account["VERSION"]}
            fixed = {"balance": 0, "owed": account["owed"] - account["balance"]}
            written = context.local.transit({"query": query, "input": fixed})
            if isinstance(written, dict):
                moved += 1
            else:
                skipped += 1
        after = listed["next"]
        if after is None:
            return {"moved": moved, "skipped": skipped}
