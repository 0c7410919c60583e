# Exports pause and no resume: the component does not start.
def pause(context):
    pass
