"""The Python SDK under the real agent: `toa-agent compose` starts components written the seeds'
way (operations/*.py, rc/*.py, `python3 -m toa`), as in a local run with the embedded default.

    python3 -m unittest discover -s sdk/python/tests

The agent binary: $TOA_AGENT_BIN, else the workspace's debug build ($CARGO_TARGET_DIR or target).
"""

import concurrent.futures
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
COMPONENTS = HERE / "components"


def agent_binary():
    if os.environ.get("TOA_AGENT_BIN"):
        return os.environ["TOA_AGENT_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    return str(target / "debug" / "toa-agent")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Composition:
    """`toa-agent compose` on `components`, its output in a file."""

    def __init__(self, *components, env=None, pythonpath=HERE.parent):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="toa-sdk-", suffix=".log", delete=False)
        environ = dict(os.environ, PYTHONPATH=str(pythonpath), **(env or {}))
        self.process = subprocess.Popen(
            [agent_binary(), "compose", *map(str, components), "--listen", f"127.0.0.1:{self.port}"],
            cwd=ROOT, env=environ, stdout=self.log, stderr=subprocess.STDOUT,
        )

    def output(self):
        return Path(self.log.name).read_text(errors="replace")

    def request(self, method, path, body=None, timeout=30):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, None if body is None else json.dumps(body),
                               {"content-type": "application/json"})
            response = connection.getresponse()
            body = response.read()
            try:
                return response.status, json.loads(body or b"null")
            except ValueError:  # /readyz and /v1/drain answer text
                return response.status, body.decode(errors="replace")
        finally:
            connection.close()

    def wait_ready(self, within=30):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the agent exited with {self.process.returncode}:\n{self.output()}")
            try:
                if self.request("GET", "/readyz", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"not ready within {within} s:\n{self.output()}")

    def call(self, target, input):
        component, operation = target.rsplit(".", 1)
        return self.request("POST", f"/v1/call/{component}/{operation}", {"input": input})

    def exit_code(self, within=30):
        return self.process.wait(timeout=within)

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class SeedComponents(unittest.TestCase):
    def setUp(self):
        self.record = Path(tempfile.mkdtemp(prefix="toa-sdk-record-")) / "record"
        self.composition = Composition(COMPONENTS / "shop.catalog",
                                       env={"TOA_TEST_RECORD": str(self.record)})
        self.addCleanup(self.composition.stop)
        self.composition.wait_ready()

    def test_rc_modules_run_without_a_lifecycle_list_and_share_the_state(self):
        status, answer = self.composition.call("shop.catalog.started", {})
        self.assertEqual(status, 200, answer)
        reply = answer["reply"]
        self.assertIs(reply["started"], True, "preflight from rc/boot.py ran and kept its state")
        self.assertEqual(reply["slots"], list(range(16)), "alone, every slot")
        self.assertTrue(reply["instance"])
        self.assertEqual(len(reply["assigned"]), 1, "onassigned told the assignment at once")
        self.assertEqual(reply["configuration"], {"currency": "EUR"}, "the manifest's default")
        self.assertIsNotNone(reply["assigned"][0], reply)
        # A local run's drain: dispose, from the same module, runs before the program stops.
        status, _ = self.composition.request("POST", "/v1/drain")
        self.assertEqual(status, 200)
        self.assertEqual(self.record.read_text(), "dispose\n")

    def test_calls_go_through_context_local_and_remote(self):
        status, answer = self.composition.call("shop.catalog.quote", {"customer": "q"})
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer["reply"]["price"], {"price": 42}, "its own appraise, called")
        self.assertEqual(answer["reply"]["refused"], "UNKNOWN_COMPONENT", "a call to no component raises")

    def test_the_eleventh_appraisal_within_a_minute_is_refused(self):
        answers = [self.composition.call("shop.catalog.appraise", {"customer": "c42"})
                   for _ in range(11)]
        self.assertEqual([a[1].get("reply") for a in answers[:10]], [{"price": 42}] * 10)
        self.assertEqual(answers[10][1], {"error": {"code": "TOO_MANY_REQUESTS", "message": None}},
                         answers[10])

    def test_settlements_run_one_at_a_time_with_increasing_tokens(self):
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: self.composition.call("shop.catalog.settle", {}),
                                    range(3)))
        held = sorted((a[1]["reply"] for a in answers), key=lambda r: r["start"])
        for earlier, later in zip(held, held[1:]):
            self.assertLessEqual(earlier["end"], later["start"], held)
            self.assertLess(earlier["token"], later["token"], held)


class Packaging(unittest.TestCase):
    def test_pip_installs_it_and_the_installed_package_runs_a_component(self):
        target = Path(tempfile.mkdtemp(prefix="toa-sdk-installed-"))
        installed = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
             str(target), str(HERE.parent)],
            capture_output=True, text=True,
        )
        self.assertEqual(installed.returncode, 0, installed.stderr)
        self.assertTrue((target / "bin" / "toa-component").exists())
        composition = Composition(COMPONENTS / "shop.catalog", pythonpath=target)
        self.addCleanup(composition.stop)
        composition.wait_ready()
        status, answer = composition.call("shop.catalog.started", {})
        self.assertEqual((status, answer["reply"]["started"]), (200, True), answer)


class Refusals(unittest.TestCase):
    def refused(self, component):
        composition = Composition(COMPONENTS / component)
        self.addCleanup(composition.stop)
        code = composition.exit_code()
        self.assertNotEqual(code, 0, composition.output())
        return composition.output()

    def test_pause_without_resume_does_not_start(self):
        output = self.refused("shop.paused")
        self.assertIn("exports `pause` and no `resume`", output)

    def test_an_operation_declared_without_a_module_does_not_start(self):
        output = self.refused("shop.ghost")
        self.assertIn('the manifest declares ["ghost"] and the program has no module for them',
                      output)


if __name__ == "__main__":
    unittest.main()
