def condition(entry, previous):
    return True
