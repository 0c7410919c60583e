# The recorder, closing any connection that sends nothing for a second, as servers with an idle
# timeout do (agent/tests/pod.rs).
import http.server
import os

http.server.BaseHTTPRequestHandler.timeout = 1
here = os.path.dirname(os.path.abspath(__file__))
exec(compile(open(os.path.join(here, "recorder.py")).read(), "recorder.py", "exec"))
