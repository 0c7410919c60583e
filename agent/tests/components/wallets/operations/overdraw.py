"""Takes the amount whatever the balance: what it leaves may break the entity's schema."""


def transition(input, entry, context):
    entry["balance"] -= input["amount"]
    return entry
