"""`python3 -m toa COMMAND`: the seeds' commands for a Python project (restart, call, logs, stop),
as a reader types them in a project's directory, and where they find toa-agent."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

from test_components import COMPONENTS, HERE, agent_binary

sys.path.insert(0, str(HERE.parent))

from toa.cli import NoAgent, locate_agent  # noqa: E402

# Each test's composition alone (a local run otherwise joins the other processes of its
# application on this machine: agent/src/coordination/group).
os.environ.setdefault("TOA_ALONE", "true")


def project():
    """A project of one component (shop.catalog) and its context file, in a directory of its own."""
    root = Path(tempfile.mkdtemp(prefix="toa-py-project-"))
    shutil.copytree(COMPONENTS / "shop.catalog", root / "components" / "shop.catalog")
    (root / "context.toa.yaml").write_text("name: py\n")
    return root


class Commands(unittest.TestCase):
    def setUp(self):
        self.root = project()
        self.record = self.root / "record"
        self.env = {**os.environ, "PYTHONPATH": str(HERE.parent), "TOA_AGENT_BIN": agent_binary(),
                    "TEST_RECORD": str(self.record)}
        self.addCleanup(lambda: self.toa("stop"))

    def toa(self, *args):
        return subprocess.run([sys.executable, "-m", "toa", *args], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=180)

    def test_restart_call_logs_stop(self):
        started = self.toa("restart")
        self.assertEqual(started.returncode, 0, started.stderr)
        self.assertRegex(started.stdout, r"Composition complete \(pid \d+, local API http://127\.0\.0\.1:\d+\)")
        pid = json.loads((self.root / ".toa" / "app.json").read_text())["pid"]

        called = self.toa("call", "shop.catalog.started", "{ input: {} }")
        self.assertEqual(called.returncode, 0, called.stderr)
        self.assertIs(json.loads(called.stdout)["reply"]["started"], True, "the call reached the app restart started")
        self.assertIn("Composition complete", self.toa("logs").stdout)

        stopped = self.toa("stop")
        self.assertEqual(stopped.returncode, 0, stopped.stderr)
        self.assertEqual(self.record.read_text(), "dispose\n", "stop drained it: dispose ran")
        self.assertFalse((self.root / ".toa" / "app.json").exists())
        # Exited: gone, or a zombie nobody reaped yet (its command line is empty then).
        cmdline = Path(f"/proc/{pid}/cmdline")
        self.assertFalse(cmdline.exists() and cmdline.read_bytes(), "the agent exited")

    def test_a_start_that_fails_ends_restart_with_the_log(self):
        (self.root / "components" / "shop.catalog" / "manifest.toa.yaml").write_text("name: [\n")
        failed = self.toa("restart")
        self.assertEqual(failed.returncode, 1)
        self.assertIn("exited before it was complete", failed.stderr)
        self.assertIn("manifest.toa.yaml", failed.stderr, "the end of the log says why")

    def test_an_unknown_command_is_named(self):
        unknown = self.toa("compse")
        self.assertEqual(unknown.returncode, 2)
        self.assertIn("unknown command 'compse'", unknown.stderr)
        self.assertIn("restart", unknown.stderr)


class Stale(unittest.TestCase):
    def test_stop_signals_no_process_its_record_does_not_name_as_the_agent_it_started(self):
        root = Path(tempfile.mkdtemp(prefix="toa-py-stale-"))
        other = subprocess.Popen(["sleep", "30"])
        self.addCleanup(other.kill)
        env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
        for pid in (other.pid, 1, 0, -1, "7"):
            (root / ".toa").mkdir(exist_ok=True)
            (root / ".toa" / "app.json").write_text(json.dumps({"pid": pid, "binary": "/nowhere/toa-agent"}))
            stop = subprocess.run([sys.executable, "-m", "toa", "stop"], cwd=root, env=env,
                                  capture_output=True, text=True, timeout=60)
            self.assertEqual(stop.returncode, 0, stop.stderr)
            self.assertIn("no application started by `restart` runs here", stop.stdout, pid)
            self.assertFalse((root / ".toa" / "app.json").exists())
        self.assertIsNone(other.poll(), "the other process was not signalled")


class Locate(unittest.TestCase):
    def fake(self, directory):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "toa-agent").write_text("#!/bin/sh\n")
        (directory / "toa-agent").chmod(0o755)
        return str(directory / "toa-agent")

    def test_the_variable_then_path_then_the_newest_build(self):
        root = Path(tempfile.mkdtemp())
        given, on_path = self.fake(root / "given"), self.fake(root / "bin")
        self.assertEqual(locate_agent({"TOA_AGENT_BIN": given, "PATH": str(root / "bin")}), given)
        self.assertEqual(locate_agent({"PATH": f"/nonexistent:{root / 'bin'}"}), on_path)
        debug = self.fake(root / "target" / "debug")
        old = time.time() - 60
        os.utime(debug, (old, old))
        env = {"PATH": "", "CARGO_TARGET_DIR": str(root / "target")}
        self.assertEqual(locate_agent(env), debug, "the package sits in this repository")
        release = self.fake(root / "target" / "release")
        self.assertEqual(locate_agent(env), release, "the newer build")

    def test_a_variable_naming_no_program_is_refused_naming_it(self):
        path = Path(tempfile.mkdtemp()) / "toa-agent"
        path.write_text("not a program")
        with self.assertRaisesRegex(NoAgent, f"TOA_AGENT_BIN is {path}, which is not an executable file"):
            locate_agent({"TOA_AGENT_BIN": str(path)})

    def test_none_built_says_how_to_build_one(self):
        with self.assertRaisesRegex(NoAgent, r"not built in .*; build it there with `cargo build -p toa-agent`"):
            locate_agent({"PATH": "", "CARGO_TARGET_DIR": tempfile.mkdtemp()})


if __name__ == "__main__":
    unittest.main()
