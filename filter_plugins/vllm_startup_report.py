# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_startup_report: the numbers vLLM printed while starting, from its log. Documentation in the sidecar file
next to this one.

The parser is the collection's module_utils/vllm_log.py, the one reader of vLLM's log lines, which the modules
(vllm_diagnose, vllm_ready, through vllm_diagnosis) also use. It is imported at the first call: filter plugins are
loaded in every worker process that templates.
"""

import importlib

from ansible.errors import AnsibleFilterError

VLLM_LOG = "ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_log"


def vllm_startup_report(text):
    """The numbers of the latest vLLM start in `text` (a log as a string, or its lines as a list of strings)."""
    if isinstance(text, (list, tuple)) and all(isinstance(line, str) for line in text):
        text = "\n".join(text)
    if not isinstance(text, str):
        raise AnsibleFilterError(
            "vllm_startup_report takes vLLM's log as a string or a list of lines (e.g. the stdout of journalctl "
            "-u vllm@NAME, or a registered result's stdout_lines), got %s" % type(text).__name__)
    return importlib.import_module(VLLM_LOG).startup_report(text)


class FilterModule(object):
    """vLLM startup log filters."""

    def filters(self):
        return {"vllm_startup_report": vllm_startup_report}
