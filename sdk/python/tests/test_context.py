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


if __name__ == "__main__":
    unittest.main()
