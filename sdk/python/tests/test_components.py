"""The Python SDK under the real agent: `toa-agent compose` starts components written the seeds'
way (operations/*.py, rc/*.py, `python3 -m toa`), as in a local run with the embedded default.

    python3 -m unittest discover -s sdk/python/tests

The agent binary: $TOA_AGENT_BIN, else the workspace's debug build ($CARGO_TARGET_DIR or target).
"""

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
COMPONENTS = HERE / "components"
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(HERE.parent))

from toa import CallError, Error  # noqa: E402
from toa.runtime import Component  # noqa: E402
from toa.stage import compose  # noqa: E402

# Each test's composition alone (a local run otherwise joins the other processes of its
# application on this machine: agent/src/coordination/group).
os.environ.setdefault("TOA_ALONE", "true")

def agent_binary():
    if os.environ.get("TOA_AGENT_BIN"):
        return os.environ["TOA_AGENT_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    return str(target / "debug" / "toa-agent")


def stage(*components, env=None, pythonpath=HERE.parent, context=None):
    """`toa-agent compose` on `components`, through the SDK's own stage."""
    environ = {"PYTHONPATH": str(pythonpath), **(env or {})}
    return compose([str(c) for c in components], context=context, env=environ, agent=agent_binary())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SeedComponents(unittest.TestCase):
    def setUp(self):
        self.record = Path(tempfile.mkdtemp(prefix="toa-sdk-record-")) / "record"
        self.stage = stage(COMPONENTS / "shop.catalog", env={"TEST_RECORD": str(self.record)})
        self.addCleanup(self.stage.stop)

    def test_rc_modules_run_without_a_lifecycle_list_and_share_the_state(self):
        reply = self.stage.call("shop.catalog.started", {"input": {}})
        self.assertIs(reply["started"], True, "preflight from rc/boot.py ran and kept its state")
        self.assertEqual(reply["slots"], list(range(16)), "alone, every slot")
        self.assertTrue(reply["instance"])
        self.assertEqual(len(reply["assigned"]), 1, "onassigned told the assignment at once")
        self.assertEqual(reply["configuration"], {"currency": "EUR"}, "the manifest's default")
        self.assertIsNotNone(reply["assigned"][0], reply)
        # A local run's drain: dispose, from the same module, runs before the program stops.
        self.assertEqual(self.stage.stop(), 0, self.stage.output())
        self.assertEqual(self.record.read_text(), "dispose\n")

    def test_calls_go_through_context_local_and_remote(self):
        reply = self.stage.call("shop.catalog.quote", {"input": {"customer": "q"}})
        self.assertEqual(reply["price"], {"price": 42}, "its own appraise, called")
        self.assertEqual(reply["refused"], "UNKNOWN_COMPONENT", "a call to no component raises")
        self.assertIsNone(reply["task"], "discard=True sends a task: None once the broker took it")
        self.assertIs(reply["task_ran"], True, "and the task ran")

    def test_the_stash_keeps_a_value_for_its_ttl_and_deletes_it(self):
        def stash(**input):
            return self.stage.call("shop.catalog.stashed", {"input": input})

        self.assertEqual(stash(op="set", key="a/b", value={"rate": 1.1}, ttl=60000), {"done": None})
        self.assertEqual(stash(op="get", key="a/b"), {"done": {"rate": 1.1}}, "a key with a slash, quoted")
        self.assertEqual(stash(op="delete", key="a/b"), {"done": True})
        self.assertEqual(stash(op="get", key="a/b"), {"done": None})
        refused = stash(op="set", key="k", value=1, ttl=0)
        self.assertEqual(refused["error"]["code"], "BAD_REQUEST")
        self.assertIn("ttl: expected 1 to", refused["error"]["message"])

    def test_context_call_is_the_call_the_operation_answers(self):
        before = time.time() * 1000
        first = self.stage.call("shop.catalog.started", {"input": {}})["call"]
        self.assertRegex(first["id"], r"\S")
        self.assertIs(first["redelivered"], False)
        self.assertGreater(first["deadline_ms"], before, first)
        self.assertNotEqual(self.stage.call("shop.catalog.started", {"input": {}})["call"]["id"], first["id"])

    def test_the_eleventh_appraisal_within_a_minute_is_refused(self):
        answers = [self.stage.call("shop.catalog.appraise", {"input": {"customer": "c42"}})
                   for _ in range(11)]
        self.assertEqual(answers[:10], [{"price": 42}] * 10)
        self.assertIsInstance(answers[10], Error)
        self.assertEqual(answers[10].code, "TOO_MANY_REQUESTS")

    def test_settlements_run_one_at_a_time_with_increasing_tokens(self):
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            held = list(pool.map(lambda _: self.stage.call("shop.catalog.settle", {"input": {}}),
                                 range(3)))
        held.sort(key=lambda r: r["start"])
        for earlier, later in zip(held, held[1:]):
            self.assertLessEqual(earlier["end"], later["start"], held)
            self.assertLess(earlier["token"], later["token"], held)


class RedisServer:
    """A redis-server of the test's own on a free port, nothing kept on disk."""

    def __init__(self):
        self.port = free_port()
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self):
        self.process.send_signal(signal.SIGSTOP)

    def kill(self):
        self.process.send_signal(signal.SIGCONT)
        self.process.kill()
        self.process.wait()


def wait_for(condition, within, what):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {within} s: {what}")


class OtlpReceiver:
    """An OTLP/HTTP trace receiver of the test's own (agent/tests/otlp_receiver.py, decoding with
    the OpenTelemetry project's messages): its `endpoint`, and the `spans` it took so far."""

    def __init__(self):
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "agent" / "tests" / "otlp_receiver.py"), str(port)],
            stdout=subprocess.PIPE, text=True)
        first = self.process.stdout.readline().strip()
        if first != "listening":
            self.stop()
            raise AssertionError(f"the OTLP receiver did not start: {first!r}")
        self.spans = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.spans.append(json.loads(line))

    def named(self, name):
        return next((span for span in list(self.spans) if span["name"] == name), None)

    def stop(self):
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()


class Traces(unittest.TestCase):
    def test_an_operations_calls_join_the_trace_its_request_came_with(self):
        receiver = OtlpReceiver()
        self.addCleanup(receiver.stop)
        record = Path(tempfile.mkdtemp(prefix="toa-sdk-record-")) / "record"
        env = {"TEST_RECORD": str(record), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
               "OTEL_BSP_SCHEDULE_DELAY": "50"}
        running = stage(COMPONENTS / "shop.catalog", env=env)
        self.addCleanup(running.stop)
        running.call("shop.catalog.quote", {"input": {"customer": "q"}})
        names = ["call shop.catalog.quote", "operate shop.catalog.quote", "call shop.catalog.appraise",
                 "operate shop.catalog.appraise", "task shop.catalog.remember"]
        wait_for(lambda: all(receiver.named(name) for name in names), 20, f"the spans {names}")
        call, quote, nested, appraise, task = (receiver.named(name) for name in names)
        self.assertEqual(quote["parent"], call["span"], receiver.spans)
        self.assertEqual(nested["parent"], quote["span"], "the program passed the trace it was given on")
        self.assertEqual(appraise["parent"], nested["span"])
        self.assertEqual(task["parent"], quote["span"], "a task too")
        self.assertEqual({span["trace"] for span in (call, quote, nested, appraise, task)}, {call["trace"]})


class Faults(unittest.TestCase):
    def test_a_lock_whose_redis_stops_under_the_holder_aborts_its_signal(self):
        redis = RedisServer()
        self.addCleanup(redis.kill)
        scratch = Path(tempfile.mkdtemp(prefix="toa-sdk-lock-"))
        context = scratch / "context.toa.yaml"
        context.write_text(f"name: sdk\natomicity:\n  redis: redis://127.0.0.1:{redis.port}\n"
                           "  interval: 1000\n  ttl: 2000\n")
        record = scratch / "record"
        composition = stage(COMPONENTS / "shop.catalog", context=context,
                            env={"TEST_RECORD": str(record)})
        self.addCleanup(composition.stop, 10)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            settling = pool.submit(composition.call, "shop.catalog.settle", {"input": {"hold_ms": 8000}})
            wait_for(lambda: record.exists() and "held" in record.read_text(), 10, "the lock held")
            redis.stop()
            with self.assertRaises(CallError) as failed:
                settling.result(timeout=30)
        self.assertEqual(failed.exception.name, "FAILED")
        # The program's log reaches the stage through the agent, maybe after the call's answer.
        wait_for(lambda: "the lock was lost" in composition.output(), 5, "the operation saw signal.aborted")


class Deadlines(unittest.TestCase):
    def test_a_locks_wait_ends_with_its_call_and_what_it_guards_never_runs(self):
        """Seed 000: the lock wait counts toward the operation's duration."""
        scratch = Path(tempfile.mkdtemp(prefix="toa-sdk-deadline-"))
        context = scratch / "context.toa.yaml"
        context.write_text("name: sdk\nlimits:\n  operation: 1000\n")  # ordinary calls of a second
        record = scratch / "record"
        composition = stage(COMPONENTS / "shop.catalog", context=context, env={"TEST_RECORD": str(record)})
        self.addCleanup(composition.stop, 10)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            holding = pool.submit(composition.call, "shop.catalog.settle", {"input": {"hold_ms": 3000}})
            wait_for(lambda: record.exists() and "held" in record.read_text(), 10, "the holder holds")
            with self.assertRaises(CallError) as failed:
                composition.call("shop.catalog.guarded", {"input": None})
            self.assertEqual(failed.exception.name, "FAILED", "the caller: failed at the limit")
            wait_for(lambda: len(record.read_text().split()) == 2, 5, "the guarded call ended")
            self.assertEqual(record.read_text().split(), ["held", "DEADLINE"],
                             "the lock refused at the deadline, before the holder let go: its work never ran")
            with self.assertRaises(CallError):
                holding.result(timeout=10)


class Examples(unittest.TestCase):
    def test_the_poller_halts_and_restores_with_its_state_through_the_stage(self):
        poller = stage(EXAMPLES / "poller", env={"POLLER_INTERVAL_MS": "100"})
        self.addCleanup(poller.stop)
        polls = lambda: poller.call("poller.polls")["polls"]  # noqa: E731
        wait_for(lambda: polls() >= 2, 5, "two polls")
        poller.halt()
        paused = poller.call("poller.polls")
        self.assertFalse(paused["polling"])
        time.sleep(0.5)  # five polling intervals, in which nothing may poll
        self.assertEqual(polls(), paused["polls"], "no poll while halted")
        poller.restore()
        wait_for(lambda: polls() > paused["polls"], 5, "a poll after restore")
        self.assertTrue(poller.call("poller.polls")["polling"])
        self.assertLessEqual(polls() - paused["polls"], 20, "counting on from the same state, not again")


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
        composition = stage(COMPONENTS / "shop.catalog", pythonpath=target)
        self.addCleanup(composition.stop)
        self.assertIs(composition.call("shop.catalog.started", {"input": {}})["started"], True)


class Conditions(unittest.TestCase):
    """`events/<name>.py`'s condition(entry, previous), as the program answers POST /conditions."""

    def component(self, **conditions):
        return Component({}, {}, None, conditions=conditions)  # type: ignore[arg-type]

    def test_the_events_whose_condition_holds_with_entry_and_previous_as_objects(self):
        component = self.component(
            big=lambda entry, previous: entry.n >= 10,
            crossed=lambda entry, previous: entry.n >= 10 and (previous is None or previous.n < 10),
        )
        self.assertEqual(component.publish({"n": 12}, {"n": 3}), {"publish": ["big", "crossed"]})
        self.assertEqual(component.publish({"n": 12}, {"n": 11}), {"publish": ["big"]})
        self.assertEqual(component.publish({"n": 12}, None), {"publish": ["big", "crossed"]})
        self.assertEqual(component.publish({"n": 1}, None), {"publish": []})

    def test_a_condition_that_answers_no_boolean_fails_naming_it(self):
        component = self.component(forgot=lambda entry, previous: None)
        with self.assertRaisesRegex(TypeError, "events/forgot.py: condition returned NoneType"):
            component.publish({"n": 1}, None)


class Refusals(unittest.TestCase):
    def refused(self, component):
        with self.assertRaises(RuntimeError) as refused:
            stage(COMPONENTS / component).stop()
        return str(refused.exception)

    def test_pause_without_resume_does_not_start(self):
        self.assertIn("exports `pause` and no `resume`", self.refused("shop.paused"))

    def test_an_operation_declared_without_a_module_does_not_start(self):
        self.assertIn('the manifest declares ["ghost"] and the program has no module for them',
                      self.refused("shop.ghost"))

    def test_a_receiver_module_for_an_event_not_received_does_not_start(self):
        self.assertIn("it has a receiver module for \"shop.orders.cancelled\", which the "
                      "manifest's receivers do not name", self.refused("shop.stray"))

    def test_a_receiver_module_without_request_does_not_start(self):
        self.assertIn("receivers/shop.orders.approved.py: expected a function named "
                      "request(payload)", self.refused("shop.requestless"))

    def test_a_condition_for_an_event_not_declared_does_not_start(self):
        self.assertIn('it has a condition module for the event "gone" (events/gone), which the '
                      "manifest's events do not name", self.refused("shop.unconditioned"))

    def test_an_event_module_without_condition_does_not_start(self):
        self.assertIn("events/changed.py: expected a function named condition(entry, previous)",
                      self.refused("shop.conditionless"))


if __name__ == "__main__":
    unittest.main()
