"""`python3 -m toa COMMAND`: the seeds' commands for Python projects, run by toa-agent.

The same commands, files and rules as the TypeScript package's `npx toa` (sdk/typescript/lib/cli.js):
an application started in the background keeps its process id, its local API's address and its
log in the project's `.toa/` directory. Without a command, `python3 -m toa` is a component's
program (`toa.runtime`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, TypedDict

USAGE = """toa: the seeds' commands, run by toa-agent

  python3 -m toa compose DIR...             run components here, in the foreground (Ctrl-C drains them)
  python3 -m toa call C.OPERATION [REQUEST] call an operation: ... call store.catalog.appraise "{ input: {...} }"
                                            (--task sends a task; --agent URL, else the app `restart` started)
  python3 -m toa restart [DIR...]           (re)start the application in the background (default: ./components/*);
                                            returns once "Composition complete" is logged
  python3 -m toa stop                       drain the application `restart` started: dispose runs, then it exits
  python3 -m toa logs                       print its log (.toa/app.log)
  python3 -m toa                            (no command) a component's program, started by toa-agent

The agent: $TOA_AGENT_BIN, else toa-agent on PATH, else a build in the toa repository this
package sits in (cargo build -p toa-agent)."""

COMMANDS = ("compose", "call", "restart", "stop", "logs", "help", "--help", "-h")

STATE = Path(".toa")
RECORD = STATE / "app.json"
LOG = STATE / "app.log"


class NoAgent(Exception):
    """No toa-agent to run: the exit code says "command not found"."""


class Running(TypedDict, total=False):
    """What `restart` keeps: the agent's pid and the binary it runs (to know it again), its local
    API's address once it serves, its log."""

    pid: int
    binary: str
    agent: Optional[str]
    log: str
    started: str


def _seconds(variable: str, default: float) -> float:
    return float(os.environ.get(variable, default))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _repository_of(start: Path) -> Optional[Path]:
    """The toa repository holding `start` (a Cargo.toml beside agent/), if any."""
    for directory in (start.resolve(), *start.resolve().parents):
        if (directory / "Cargo.toml").is_file() and (directory / "agent" / "Cargo.toml").is_file():
            return directory
    return None


def locate_agent(env: Optional[dict[str, str]] = None, cwd: Optional[Path] = None) -> str:
    """$TOA_AGENT_BIN; toa-agent on PATH; the newest build of the toa repository this package (or
    the project) sits in. Raises NoAgent naming how to get one."""
    env = dict(os.environ) if env is None else env
    given = env.get("TOA_AGENT_BIN")
    if given:
        if _executable(Path(given)):
            return given
        raise NoAgent(f"$TOA_AGENT_BIN is {given}, which is not an executable file")
    on_path = shutil.which("toa-agent", path=env.get("PATH", ""))
    if on_path:
        return on_path
    root = _repository_of(Path(__file__).parent) or _repository_of(cwd or Path.cwd())
    if root is None:
        raise NoAgent("no toa-agent: not $TOA_AGENT_BIN and not on PATH; install it with "
                      "`cargo install --path agent` from the toa repository, or set $TOA_AGENT_BIN")
    target = root / env.get("CARGO_TARGET_DIR", "target")  # where cargo builds, as cargo reads it
    built = [target / p / "toa-agent" for p in ("release", "debug")]
    built = sorted((b for b in built if _executable(b)), key=lambda b: b.stat().st_mtime, reverse=True)
    if not built:
        raise NoAgent(f"no toa-agent: not $TOA_AGENT_BIN, not on PATH, not built in {root}; "
                      "build it there with `cargo build -p toa-agent`")
    return str(built[0])


def _alive(pid: object, binary: Optional[str] = None) -> bool:
    """Whether `pid` is the agent `binary` runs, alive: a pid file can outlive its process and a
    pid be reused, and nothing but a pid above 1 is ever signalled (`kill(-1)` reaches every
    process)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        # With /proc, no entry is no process; without (macOS) the signal's answer is all there is.
        return not Path("/proc/self").exists()
    program = cmdline.split(b"\0")[0].decode(errors="replace")  # empty for a zombie
    return program.endswith("toa-agent") if binary is None else program == binary


def running() -> Optional[Running]:
    """The application `restart` started here, if it still runs."""
    try:
        record: Running = json.loads(RECORD.read_text())
        return record if _alive(record.get("pid"), record.get("binary")) else None
    except (OSError, ValueError, AttributeError):
        return None


def _signal(pid: int, signum: int, group: bool = False) -> None:
    """Signals `pid` (its whole process group: the agent leads one, with its programs); a process
    that is already gone is no error."""
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except OSError:
        pass


def _forward(args: list[str]) -> int:
    """Runs the agent in the foreground; Ctrl-C reaches it too (one process group), and this
    process waits for it to drain."""
    child = subprocess.Popen([locate_agent(), *args])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    code = child.wait()
    return code if code >= 0 else 128 - code  # killed by a signal: 128 + its number, as a shell says


def _call(args: list[str]) -> int:
    told = any(a == "--agent" or a.startswith("--agent=") for a in args) or os.environ.get("TOA_AGENT")
    app = None if told else running()
    address = app.get("agent") if app else None
    return _forward(["call", *args, *(["--agent", address] if address else [])])


def _components() -> list[str]:
    if not Path("components").is_dir():
        raise ValueError("no components/ here (run it in the project's directory), or name the components' "
                         "directories, as `restart ./components/*`")
    return [str(d) for d in sorted(Path("components").iterdir()) if (d / "manifest.toa.yaml").is_file()]


def _exited(pid: int, within: float, binary: Optional[str] = None) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _alive(pid, binary):
            return True
        time.sleep(0.1)
    return not _alive(pid, binary)


def _stop() -> int:
    """SIGTERM drains the application (dispose runs); a kill only after $TOA_STOP_TIMEOUT."""
    app = running()
    if app is None:
        print("toa: no application started by `restart` runs here")
        RECORD.unlink(missing_ok=True)
        return 0
    pid, binary, log = app["pid"], app.get("binary"), app.get("log")
    within = _seconds("TOA_STOP_TIMEOUT", 60)
    _signal(pid, signal.SIGTERM)
    code = 0
    if not _exited(pid, within, binary):
        print(f"toa: the application (pid {pid}) did not exit within {within:g} s of SIGTERM; "
              f"killed with its programs (its log: {log})", file=sys.stderr)
        _signal(pid, signal.SIGKILL, group=True)
        _exited(pid, 5, binary)
        code = 1
    else:
        print(f"toa: stopped (pid {pid}); its log: {log}")
    RECORD.unlink(missing_ok=True)
    return code


def _completed(log: str) -> Optional[str]:
    """The local API's address the agent logged, once "Composition complete" is logged."""
    if "Composition complete" not in log:
        return None
    found = re.search(r"serving the local API agent=(\S+)", log)
    return found.group(1) if found else ""


def _environment() -> dict[str, str]:
    """The agent's environment: the two lines `restart` waits for are logged at info, whatever
    level RUST_LOG asks for otherwise."""
    level = os.environ.get("RUST_LOG")
    return {**os.environ, "RUST_LOG": f"{level},toa_agent::process::compose=info" if level else "info"}


def _restart(args: list[str]) -> int:
    """Stops the running application, starts it in the background, waits for it. What it needs
    (the agent, the components) is found before anything is stopped."""
    agent = locate_agent()
    components = args or _components()
    if running() is not None and _stop() != 0:
        return 1
    STATE.mkdir(exist_ok=True)
    if LOG.exists():
        LOG.replace(LOG.with_name("app.log.1"))  # the previous run's log, kept once
    with LOG.open("ab") as out:
        child = subprocess.Popen([agent, "compose", *components], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=out, start_new_session=True, env=_environment())
    record: Running = {"pid": child.pid, "binary": agent, "log": str(LOG),
                       "started": datetime.now(timezone.utc).isoformat()}
    # Kept at once: a restart interrupted now still leaves the agent findable by `stop`.
    RECORD.write_text(json.dumps(record) + "\n")
    deadline = time.monotonic() + _seconds("TOA_START_TIMEOUT", 120)
    while True:
        address = _completed(LOG.read_text(errors="replace"))
        if address is not None:
            RECORD.write_text(json.dumps({**record, "agent": address or None}) + "\n")
            print(f"toa: Composition complete (pid {child.pid}, local API {address}); its log: {LOG}")
            return 0
        if child.poll() is not None or time.monotonic() > deadline:
            why = "exited before it was complete" if child.poll() is not None else "not complete in time"
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(_seconds("TOA_STOP_TIMEOUT", 60))
                except subprocess.TimeoutExpired:
                    _signal(child.pid, signal.SIGKILL, group=True)
            RECORD.unlink(missing_ok=True)
            tail = "\n".join(LOG.read_text(errors="replace").splitlines()[-20:])
            print(f"toa: the application {why}; the end of its log ({LOG}):\n{tail}", file=sys.stderr)
            return 1
        time.sleep(0.1)


def _logs() -> int:
    if not LOG.exists():
        print(f"toa: no log here ({LOG}): start the application with `restart`", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(LOG.read_bytes())
    return 0


def main(argv: list[str]) -> int:
    """Runs `python3 -m toa COMMAND ARGS...`; the exit code."""
    command, args = argv[0], argv[1:]
    try:
        if command == "compose":
            return _forward(["compose", *args])
        if command == "call":
            return _call(args)
        if command == "restart":
            return _restart(args)
        if command == "stop":
            return _stop()
        if command == "logs":
            return _logs()
        print(USAGE)
        return 0
    except NoAgent as missing:
        print(f"toa: {missing}", file=sys.stderr)
        return 127
    except (OSError, ValueError) as failed:
        print(f"toa: {failed}", file=sys.stderr)
        return 1
