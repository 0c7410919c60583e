"""`onassigned` when the agent's stream ends or falls silent: the listener hears None and the
stream is opened again. A stuck or restarted agent is what this checks, so the stream comes from a
server the test controls."""

import json
import queue
import sys
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toa.context import SILENCE, Context  # noqa: E402


class Streams:
    """Each GET .../onassigned is a stream the test writes to through a queue: a line, or None to
    end it, or "hang" to write nothing more and keep it open."""

    def __init__(self):
        self.opened = queue.Queue()
        streams = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("content-type", "application/x-ndjson")
                self.end_headers()
                lines = queue.Queue()
                streams.opened.put(lines)
                while True:
                    line = lines.get()
                    if line is None:
                        return
                    if line == "hang":
                        time.sleep(SILENCE * 3)
                        return
                    self.wfile.write((line + "\n").encode())
                    self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def next(self, within=5):
        return self.opened.get(timeout=within)


def event(assignment, listener=1):
    return json.dumps({"listener": listener, "assignment": assignment})


class Listening(unittest.TestCase):
    def test_a_dropped_or_silent_stream_is_told_as_none_and_opened_again(self):
        streams = Streams()
        self.addCleanup(streams.server.shutdown)
        context = Context({"TOA_AGENT": streams.url, "TOA_COMPONENT": "shop.l", "TOA_INSTANCE": "p"})
        heard = queue.Queue()
        off = context.atom.onassigned(heard.put)
        self.addCleanup(off)
        one = {"i": 0, "n": 1, "epoch": 1}
        stream = streams.next()
        stream.put(event(one))
        stream.put(event(one))
        self.assertEqual(heard.get(timeout=2), one)
        stream.put(None)  # the agent went away
        self.assertIsNone(heard.get(timeout=2))
        stream = streams.next()
        stream.put(event(one))
        self.assertEqual(heard.get(timeout=2), one, "told again once back; the repeat was not told")
        stream.put("hang")  # stuck: no line, not even a keep-alive
        started = time.monotonic()
        self.assertIsNone(heard.get(timeout=SILENCE + 2))
        self.assertGreaterEqual(time.monotonic() - started, SILENCE - 0.1)
        streams.next()  # and it asks again


if __name__ == "__main__":
    unittest.main()
