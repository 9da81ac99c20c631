# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The roll lock, taken on the controller for the whole ansible-playbook run, and the roll journal read under it
(documentation: library/roll_lock.py).

flock(2) on the lock file, the lock `flock(1)` takes in the scheduled services, held by a small process that
lives as long as the ansible-playbook process: a run that ends, fails or is killed releases it, and nothing can
leave it behind. Workers are forked from ansible-playbook, so the worker's parent is the run.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The argument that makes this file the holder process (its command line names it in `ps`).
HOLD = "--hold-roll-lock"


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _ancestors(pid):
    """pid and its ancestors (only pid where /proc is missing)."""
    out = [pid]
    while out[-1] > 1 and len(out) < 64:
        parent = _parent(out[-1])
        if parent <= 0:
            break
        out.append(parent)
    return out


def _holders(path):
    """PIDs holding a flock on path (/proc/locks; none known where it is missing)."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    wanted = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    out = []
    for line in lines:
        words = line.split()
        if "->" in words or len(words) < 6 or words[1] != "FLOCK":
            continue
        if words[5] == wanted:
            out.append(int(words[4]))
    return out


def _held(path):
    """True while some process holds the lock (tried from a new descriptor, released at once)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _alive(pid):
    """pid runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def hold(path, run, what):
    """The holder process (this file run as a script): take the lock or say "busy", write who holds it into the
    file, then wait for the run to end."""
    try:
        fd, writable = os.open(path, os.O_RDWR | os.O_CREAT, 0o666), True
    except PermissionError:  # another user's lock file (flock(1) creates it 0666 less the umask): lock it unannotated
        fd, writable = os.open(path, os.O_RDONLY), False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("busy", flush=True)
        return 75
    if writable:
        os.ftruncate(fd, 0)
        os.write(fd, ("%d %s\n" % (run, what)).encode())
    print("locked", flush=True)
    os.dup2(os.open(os.devnull, os.O_RDWR), 1)
    while _alive(run):
        time.sleep(0.5)
    return 0


def _recorded(path):
    try:
        with open(path) as handle:
            first = handle.readline().split(" ", 1)
        return int(first[0]), first[1].strip() if len(first) > 1 else ""
    except (OSError, ValueError):
        return 0, ""


def take(path, run, what, timeout=0.0):
    """Take the lock for the run (a PID) or say who holds it: {'held_by': 'this run' | 'this run's flock' | ...}."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise AnsibleActionFail("roll_lock: the directory of the lock file %s does not exist; set "
                                "rolling_restart_lock_file to a file in an existing directory (the same for "
                                "every playbook run on this controller)" % path)
    if _recorded(path)[0] == run and _held(path):
        return {"changed": False, "held_by": "this run", "msg": "the roll lock is already held by this run"}
    mine = set(_ancestors(run))
    ancestors = [pid for pid in _holders(path) if pid in mine]
    if ancestors:
        return {"changed": False, "held_by": "this run's flock",
                "msg": "the roll lock is held for this run by pid %d (%s)" % (ancestors[0], _cmdline(ancestors[0]))}
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.Popen([sys.executable, __file__, HOLD, path, str(run), what], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True)
        answer = proc.stdout.readline().decode().strip()
        proc.stdout.close()
        if answer == "locked":
            return {"changed": False, "held_by": "this run", "msg": "took the roll lock %s for pid %d" % (path, run)}
        proc.wait()
        if answer != "busy":
            raise AnsibleActionFail("roll_lock: could not take %s (the holder process said %r)" % (path, answer))
        if time.monotonic() >= deadline:
            break
        time.sleep(1)
    # Another run's holder is described by what it recorded; any other holder (flock(1)) by its command line.
    parts = ["pid %d (%s)" % (pid, _cmdline(pid) or "?") for pid in _holders(path)
             if pid != proc.pid and HOLD not in _cmdline(pid).split()]
    recorded, recorded_what = _recorded(path)
    if recorded and _alive(recorded):
        parts.append("taken for ansible-playbook pid %d: %s" % (recorded, recorded_what))
    who = "; ".join(parts) or "another process"
    raise AnsibleActionFail(
        "another roll, drain or enable holds the roll lock %s: %s. Nothing was changed. Wait for it to end (or "
        "stop it), then run this again; a scheduled run skips while it is held." % (path, who))


def read_journal(directory):
    """The records of the roll journal (one JSON file per host an unfinished roll left out), read under the lock."""
    if not directory or not os.path.isdir(directory):
        return []
    records = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as handle:
                record = json.load(handle)
        except (OSError, ValueError) as exc:
            raise AnsibleActionFail("roll_lock: the roll journal entry %s cannot be read (%s): it records a host an "
                                    "earlier roll left out of rotation; check that host, then remove the file" % (
                                        path, exc)) from exc
        if not isinstance(record, dict) or not isinstance(record.get("host"), str):
            raise AnsibleActionFail("roll_lock: the roll journal entry %s names no host; check it, then remove the "
                                    "file" % path)
        records.append(dict(record, journal_file=path))
    return records


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("path", "what", "timeout", "journal"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        path = self._task.args.get("path")
        if not path or not isinstance(path, str):
            raise AnsibleActionFail("roll_lock: path (the lock file) is required")
        what = str(self._task.args.get("what") or "ansible-playbook").replace("\n", " ")
        try:
            timeout = float(self._task.args.get("timeout", 0))
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail("roll_lock: timeout must be a number of seconds") from exc
        # The worker running this is a fork of ansible-playbook: its parent is the run the lock lives for, and its
        # command line (the playbook, the limit) says to others what holds the lock.
        run = os.getppid()
        command = _cmdline(run)
        result.update(take(path, run, "%s, %s" % (command, what) if command else what, timeout))
        result["journal"] = read_journal(self._task.args.get("journal"))
        return result


if __name__ == "__main__":
    sys.exit(hold(sys.argv[2], int(sys.argv[3]), sys.argv[4]) if sys.argv[1:2] == [HOLD] else 2)
