# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write or clear one host's entry in the roll journal, on the controller (documentation: library/roll_journal.py).

An action, not a module delegated to localhost: the roll writes the journal at each step of each host, and a module
run costs a second or more on a busy controller, for a file the controller writes itself. roll_lock reads the
journal back under the lock.
"""
from __future__ import annotations

import json
import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


def entry(directory, host):
    """The journal file of a host: <directory>/<host>.json (roll_lock reads every *.json there)."""
    return os.path.join(directory, host + ".json")


def write(path, record):
    """Replace the entry at path by the record, atomically: a run killed mid-write leaves the old entry or the
    new one, never half of one. True when the file changed."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    text = json.dumps(record, indent=4, sort_keys=True) + "\n"
    try:
        with open(path) as handle:
            if handle.read() == text:
                return False
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def forget(path):
    """Remove the entry at path. True when there was one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dir", "host", "record", "state"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        directory, host, state = args.get("dir"), args.get("host"), args.get("state", "present")
        if not directory or not isinstance(directory, str):
            raise AnsibleActionFail("roll_journal: dir (rolling_restart_journal_dir) is required")
        if not host or not isinstance(host, str) or "/" in host or host.startswith("."):
            raise AnsibleActionFail("roll_journal: host must be an inventory hostname, got %r" % (host,))
        if state not in ("present", "absent"):
            raise AnsibleActionFail("roll_journal: state must be present or absent, got %r" % (state,))
        path = result["path"] = entry(directory, host)
        if state == "absent":
            result["changed"] = os.path.exists(path) if self._task.check_mode else forget(path)
            return result
        record = args.get("record")
        if not isinstance(record, dict) or record.get("host") != host:
            raise AnsibleActionFail("roll_journal: record must be a dict whose host is %r" % host)
        # Check mode drains nothing, so there is nothing to record.
        result["changed"] = True if self._task.check_mode else write(path, record)
        return result
