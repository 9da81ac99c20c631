# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared helpers of the sizing package: byte units, the error every input problem raises, integer and dict
checks, integer division as vLLM rounds.
"""

import math

from ansible.errors import AnsibleFilterError

GiB = 1 << 30
MiB = 1 << 20


def fail(msg):
    raise AnsibleFilterError(msg)


def cdiv(a, b):
    return -(-a // b)


def gib(n):
    return "%.2f GiB" % (n / GiB)


def format_gib(n, fixed=None):
    """GiB as vLLM prints them: format_gib's round(bytes / GiB, 2) (5.625 -> 5.62, 2 -> 2.0), or a fixed format."""
    return fixed % (n / GiB) if fixed else "%s" % round(n / GiB, 2)


# No count, length or size the filters read comes near this; a larger one is a typo (or an attempt to make the
# arithmetic loop over it) and is refused rather than sized.
INT_LIMIT = 1 << 50


def as_int(value, field, minimum=1, allow_none=False, maximum=INT_LIMIT):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        fail("%s must be an integer, got %r" % (field, value))
    if value < minimum:
        fail("%s must be at least %d, got %d" % (field, minimum, value))
    if value > maximum:
        fail("%s must be at most %d, got %d" % (field, maximum, value))
    return value


def as_number(value, field, maximum=None):
    """A finite number above 0 (and at most maximum): a string such as "1e6", None, NaN or inf is refused."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
            or (maximum is not None and value > maximum)):
        fail("%s must be a positive number%s, got %r" % (field, "" if maximum is None else " up to %g" % maximum,
                                                         value))
    return value


def as_utilization(value, field):
    """gpu_memory_utilization, the one valid range of this project for it everywhere (the policy, the flag it
    renders, a start's record): above 0 and below 1. vLLM takes 1.0, but it leaves PyTorch and prefill spikes no
    headroom, and no plan here asks for it, so a record that says 1.0 is not of one of its plans."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        fail("%s must be a number between 0 and 1 (exclusive: 1.0 leaves PyTorch and prefill spikes no headroom), "
             "got %r" % (field, value))
    return float(value)


def as_bool(value, field, default=None):
    """A real boolean (None: default). A string is never taken for one: bool("false") is true."""
    if value is None:
        return default
    if not isinstance(value, bool):
        fail("%s must be true or false, got %r%s" % (field, value, " (a string is not a boolean)"
                                                     if isinstance(value, str) else ""))
    return value


def as_names(value, field):
    """A list of names (module names, patterns) as a tuple; None: empty."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        fail("%s must be a list of non-empty strings, got %r" % (field, value))
    return tuple(value)


def as_dict(value, field):
    if value is None:
        return {}
    if not isinstance(value, dict):
        fail("%s must be a dict, got %s" % (field, type(value).__name__))
    return value
