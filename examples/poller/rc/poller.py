# The seed's poller (store.catalog's rc/poller.ts): it polls on a timer of its own, which no halt
# stops for it, so it stops the timer in pause and starts it again in resume.
#
# Each poll looks at the file in $POLLER_WATCH (its size and modification time; without the
# variable, a poll only counts) every $POLLER_INTERVAL_MS (1000). Every run command and poll is
# printed, and appended as a JSON line to the file in $TEST_RECORD when it is set.
import json
import os
import sys
import threading
import time

INTERVAL = int(os.environ.get("POLLER_INTERVAL_MS", "1000")) / 1000
WATCH = os.environ.get("POLLER_WATCH")

writing = threading.Lock()


def record(event, **fields):
    line = json.dumps({"event": event, "pid": os.getpid(), "at": time.monotonic(), **fields})
    with writing:
        print(f"poller: {line}", flush=True)
        if os.environ.get("TEST_RECORD"):
            with open(os.environ["TEST_RECORD"], "a") as out:
                out.write(line + "\n")


class Interval:
    """setInterval on a thread of its own; clear() is clearInterval."""

    def __init__(self, seconds, function):
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(seconds, function), daemon=True)
        self.thread.start()

    def _run(self, seconds, function):
        while not self.stopped.wait(seconds):
            try:
                function()
            except Exception as exception:  # a failed poll does not stop the timer
                print(f"poller: poll failed: {exception!r}", file=sys.stderr, flush=True)

    def clear(self):
        """Returns once a poll in flight has ended: nothing polls after it."""
        self.stopped.set()
        self.thread.join()


def poll(context):
    try:
        stat = os.stat(WATCH) if WATCH else None
        seen = stat and [stat.st_size, stat.st_mtime_ns]
    except FileNotFoundError:
        seen = None
    changed = seen != context.state.get("seen")
    context.state["seen"] = seen
    context.state["polls"] += 1
    record("poll", n=context.state["polls"], changed=changed)


def start(context):
    context.state["poller"] = Interval(INTERVAL, lambda: poll(context))


def stop(context):
    if "poller" in context.state:
        context.state.pop("poller").clear()


def preflight(context):
    context.state["polls"] = 0
    record("preflight")
    start(context)


def pause(context):
    stop(context)
    record("pause", polls=context.state["polls"])


def resume(context):
    # The same process and the same context.state: take again what pause released.
    record("resume", polls=context.state["polls"])
    start(context)


def dispose(context):
    stop(context)
    record("dispose", polls=context.state["polls"])
