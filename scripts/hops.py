#!/usr/bin/env python3
"""Where an ordinary call's time goes, hop by hop: scripts/profile-calls's `hops` part.

Usage: hops.py RUNS SPANS

RUNS has a line per load: `CALLERS CALLS HTTP LAPIN SECONDS FROM TO`: the calls made in 20 s; the
bare loopback HTTP round trips to the program alone in 10 s; the bare lapin request/replies (a
transient queue, as ordinary calls' is) and the seconds they took; the load's window, in ns since
the epoch. SPANS is what agent/tests/otlp_receiver.py printed: one JSON line per span the agents exported.

A sampled call is three spans in one trace: `call` in the calling agent C (from after the
request's body is read and parsed to the outcome, before the answer is written), `receive` and `operate` in the serving agent A (from the delivery; the
program's run). Their edges, on the one clock of this machine, cut the call into hops; the time
outside C's span is the load's mean less the mean of C's spans.
"""

import json
import statistics
import sys

SPANS = ("call", "receive", "operate")
HOPS = [
    ("outside C's span: HTTP from the load into C and back, the body read, the answer written", None),
    ("C's span to A's: C's route and publish, the broker, A's consume until its task runs",
     ("call.start", "receive.start")),
    ("A before the program: the call read, its deadline, id and contract",
     ("receive.start", "operate.start")),
    ("the program's hop: HTTP to the program and back, JSON both ways, its run",
     ("operate.start", "operate.end")),
    ("the reply: A's publish, the broker, C's wait, until C's span ends", ("operate.end", "call.end")),
]


def traces(path):
    """Each trace's spans by kind (the name's first word)."""
    found = {}
    for line in open(path):
        if not line.startswith("{"):
            continue
        span = json.loads(line)
        if "name" in span:
            kinds = found.setdefault(span["trace"], {})
            kinds.setdefault(span["name"].split(" ")[0], []).append(span)
    return found


def edges(found, start, end):
    """The span edges of each complete call (one span of each kind) that began in the window."""
    rows = []
    for kinds in found.values():
        if any(len(kinds.get(kind, [])) != 1 for kind in SPANS):
            continue
        row = {f"{k}.{edge}": kinds[k][0][edge] for k in SPANS for edge in ("start", "end")}
        if start <= row["call.start"] <= end:
            rows.append(row)
    return rows


def report(run, found):
    callers, calls, http, lapin, seconds, start, end = run.split()
    callers, calls, http, start, end = (int(x) for x in (callers, calls, http, start, end))
    # Mean µs a call: each caller makes one call after another for the whole window.
    total = callers * 20e6 / calls
    http_us = callers * 10e6 / http
    lapin_us = callers * float(seconds) * 1e6 / int(lapin)
    rows = edges(found, start, end)
    if not rows:
        print(f"{callers} caller(s): no complete trace (call, receive, operate) came")
        return
    in_span = statistics.mean((r["call.end"] - r["call.start"]) / 1e3 for r in rows)
    print(f"{callers} caller(s): {calls / 20:,.0f} calls/s, {total:,.1f} µs a call (the load's mean); "
          f"{len(rows)} traces")
    print(f"  bare, the same run: a loopback HTTP round trip to the program alone {http_us:,.1f} µs "
          f"({http / 10:,.0f}/s); a lapin request/reply {lapin_us:,.1f} µs "
          f"({int(lapin) / float(seconds):,.0f}/s)")
    print(f"  {'hop':86} {'mean µs':>8} {'p50 µs':>7} {'share':>6}")
    means = []
    for name, (first, last) in ((n, e or (None, None)) for n, e in HOPS):
        if first is None:
            mean, p50 = total - in_span, float("nan")
        else:
            values = [(r[last] - r[first]) / 1e3 for r in rows]
            mean, p50 = statistics.mean(values), statistics.median(values)
        means.append(mean)
        print(f"  {name:86} {mean:8.1f} {p50:7.1f} {mean / total:6.1%}")
    print(f"  {'sum':86} {sum(means):8.1f}")
    # What each hop is, beside the bare thing it carries.
    legs = means[1] + means[4]
    print(f"  the two broker legs {legs:,.1f} µs: {legs / lapin_us:.2f}× a bare lapin request/reply; "
          f"the program's hop {means[3]:,.1f} µs: {means[3] / http_us:.2f}× a bare loopback HTTP "
          f"round trip; outside C's span {means[0]:,.1f} µs: {means[0] / http_us:.2f}× one")


def main():
    found = traces(sys.argv[2])
    for run in open(sys.argv[1]):
        report(run, found)


if __name__ == "__main__":
    main()
