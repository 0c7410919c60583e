"""What the context does without an agent to answer, and what the program says when it is not
started by one."""

import os
import subprocess
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from toa import CallError, Context  # noqa: E402


class WithoutAnAgent(unittest.TestCase):
    def test_a_call_the_agent_does_not_answer_is_a_call_error(self):
        context = Context({"TOA_AGENT": "http://127.0.0.1:1", "TOA_COMPONENT": "shop.c"})
        with self.assertRaises(CallError) as failed:
            context.remote.shop.other.op({"input": {}})
        self.assertEqual(failed.exception.name, "UNAVAILABLE")
        with self.assertRaises(CallError):
            context.atom.meter("k", 1)

    def test_an_unknown_request_field_is_refused_naming_it_before_anything_is_sent(self):
        context = Context({"TOA_AGENT": "http://127.0.0.1:1", "TOA_COMPONENT": "shop.c"})
        with self.assertRaises(CallError) as refused:
            context.remote.shop.other.op({"input": {}, "qeury": {"id": "x"}})
        self.assertEqual((refused.exception.code, refused.exception.name), (202, "RequestContract"))
        self.assertEqual(str(refused.exception),
                         "shop.other.op: unknown request field `qeury` (known: input, instance, query, key)")

    def test_secrets_are_put_in_place_from_their_variables(self):
        environ = {"TOA_AGENT": "http://127.0.0.1:1", "TOA_COMPONENT": "shop.c",
                   "TOA_CONFIGURATION": '{"key": "$MAIL_KEY", "list": [1, "$OTHER", "$lower"], "plain": "x"}',
                   "TOA_SECRET_MAIL_KEY": "k-value", "TOA_SECRET_OTHER": "o-value"}
        self.assertEqual(Context(environ).configuration,
                         {"key": "k-value", "list": [1, "o-value", "$lower"], "plain": "x"})
        del environ["TOA_SECRET_OTHER"]
        with self.assertRaises(RuntimeError) as missing:
            Context(environ)
        self.assertIn("TOA_CONFIGURATION/list/1: the secret $OTHER has no value", str(missing.exception))

    def test_a_program_not_started_by_the_agent_says_what_is_missing(self):
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TOA_")}
        environ["PYTHONPATH"] = str(HERE.parent)
        for extra, expected in (({}, "TOA_PORT"), ({"TOA_PORT": "4000"}, "TOA_AGENT"),
                                ({"TOA_PORT": "4000", "TOA_AGENT": "http://127.0.0.1:1",
                                  "TOA_COMPONENT": "shop.c", "TOA_CONFIGURATION": "{"}, "TOA_CONFIGURATION"),
                                ({"TOA_PORT": "4000", "TOA_AGENT": "http://127.0.0.1:1", "TOA_COMPONENT": "shop.c",
                                  "TOA_CONFIGURATION": '{"key": "$MAIL_KEY"}'}, "TOA_SECRET_MAIL_KEY is not set")):
            program = subprocess.run([sys.executable, "-m", "toa"], cwd=HERE / "components" / "shop.catalog",
                                     env={**environ, **extra}, capture_output=True, text=True, timeout=30)
            self.assertEqual(program.returncode, 1, program.stderr)
            self.assertIn(expected, program.stderr)
            self.assertNotIn("Traceback", program.stderr)



class OnlyTheAgent(unittest.TestCase):
    """A program that knows its token answers only requests that carry it, as the agent's do: no
    other process in the pod can run its run commands or operations."""

    def test_requests_without_the_components_token_are_refused(self):
        import http.client
        import json
        import socket
        import time
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TOA_")}
        environ.update({"PYTHONPATH": str(HERE.parent), "TOA_PORT": str(port),
                        "TOA_AGENT": "http://127.0.0.1:1", "TOA_COMPONENT": "shop.catalog",
                        "TOA_AGENT_TOKEN": "the-token"})
        program = subprocess.Popen([sys.executable, "-m", "toa"], env=environ,
                                   cwd=HERE / "components" / "shop.catalog",
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(program.wait)
        self.addCleanup(program.kill)

        def ask(method, path, token=None, body=b"{}"):
            headers = {"content-type": "application/json"}
            if token is not None:
                headers["authorization"] = f"Bearer {token}"
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                connection.request(method, path, body=body if method == "POST" else None,
                                   headers=headers)
                return connection.getresponse().status
            finally:
                connection.close()

        deadline = time.time() + 20
        while True:
            try:
                ask("GET", "/program", "the-token")
                break
            except OSError:
                self.assertLess(time.time(), deadline, "the program did not serve its port")
                time.sleep(0.1)
        self.assertEqual(ask("GET", "/program"), 401)
        self.assertEqual(ask("POST", "/lifecycle/dispose"), 401)
        self.assertEqual(ask("POST", "/operations/quote", "another-token"), 401)
        self.assertEqual(ask("GET", "/program", "the-token"), 200)
        # With the token the request reaches the operation (which fails here: no agent answers
        # its calls), not the refusal.
        self.assertEqual(ask("POST", "/operations/started", "the-token"), 500)
        # A call whose caller stopped waiting does not reach the operation: 504, not its 500.
        def with_deadline(ms):
            return json.dumps({"input": {}, "call": {"id": "c", "deadline_ms": ms}}).encode()
        past, future = int(time.time() * 1000) - 1, int(time.time() * 1000) + 60_000
        self.assertEqual(ask("POST", "/operations/started", "the-token", with_deadline(past)), 504)
        self.assertEqual(ask("POST", "/operations/started", "the-token", with_deadline(future)), 500)


if __name__ == "__main__":
    unittest.main()
