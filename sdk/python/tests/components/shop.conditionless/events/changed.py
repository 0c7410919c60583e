def when(entry, previous):
    return True
