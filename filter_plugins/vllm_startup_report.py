# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_startup_report: the numbers vLLM printed while starting, from its log. Documentation in the sidecar file
next to this one.

The parser is roles/vllm/module_utils/vllm_log.py, the one reader of vLLM's log lines, which the role's modules
(vllm_diagnose, vllm_ready, through vllm_diagnosis) also use. A filter plugin cannot import a role's module_utils
through Ansible's loader, and moving the file to a project-level module_utils directory would make the role depend
on this project's ansible.cfg; so this plugin loads that file by its path in the same checkout. It imports nothing
from Ansible, which makes that safe.
"""

import importlib.util
import os
import sys

from ansible.errors import AnsibleFilterError

_NAME = "vllm_fleet_vllm_log"
_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "roles", "vllm", "module_utils",
                     "vllm_log.py")


def _vllm_log():
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, _PATH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[_NAME] = module
    return sys.modules[_NAME]


def vllm_startup_report(text):
    """The numbers of the latest vLLM start in `text` (a log as a string, or its lines as a list of strings)."""
    if isinstance(text, (list, tuple)) and all(isinstance(line, str) for line in text):
        text = "\n".join(text)
    if not isinstance(text, str):
        raise AnsibleFilterError(
            "vllm_startup_report takes vLLM's log as a string or a list of lines (e.g. the stdout of journalctl "
            "-u vllm@NAME, or a registered result's stdout_lines), got %s" % type(text).__name__)
    return _vllm_log().startup_report(text)


class FilterModule(object):
    """vLLM startup log filters."""

    def filters(self):
        return {"vllm_startup_report": vllm_startup_report}
