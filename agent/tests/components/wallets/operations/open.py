"""An assignment with a module: returns the properties to write."""


def assignment(input, context):
    return {"owner": input["owner"].strip().title()}
