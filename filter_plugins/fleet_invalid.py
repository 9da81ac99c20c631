# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""fleet_invalid: what is wrong with inventory values, checked at the door before anything is written.

Roles call it once in their preflight with every value that ends up in a unit file, an environment file, a
command line or haproxy.cfg; an empty list means everything is fine. Messages name the variable and never print a
secret. Documentation is in fleet_invalid.yml next to this file.
"""

import re

from ansible.errors import AnsibleFilterError

RULES = {
    # systemd instance names, server names: one word, no path separators, no leading dot or dash.
    "name": (re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"),
             "a name of letters, digits and . _ - (at most 64, starting with a letter or digit)"),
    "user": (re.compile(r"^[a-z_][a-z0-9_-]{0,31}$"), "a Unix user name ([a-z_][a-z0-9_-]*)"),
    "path": (re.compile(r"^(/[A-Za-z0-9_.@+-]+)+/?$|^/$"),
             "an absolute path of letters, digits and . _ - @ + (no spaces, no ..)"),
    "host": (re.compile(r"^[A-Za-z0-9_.:\[\]-]+$"), "a host name or IP address"),
    "env": (re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$"), "an environment variable name"),
}


def _control(text):
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _problem(name, value, kind):
    """None if value is a valid `kind`, else what is wrong (without the value when it is a secret)."""
    if kind == "port":
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            return "%s must be a port number from 1 to 65535, got %r" % (name, value)
        return None
    if kind == "secret":
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            return "%s must be a string" % name
        if any(not 32 <= ord(c) <= 126 for c in value) or value != value.strip():
            # HTTP headers carry it: printable ASCII, and surrounding spaces would be trimmed by the server.
            return ("%s holds characters other than printable ASCII, or leading/trailing spaces (the value is not "
                    "shown)" % name)
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        return "%s must be a string, got %s" % (name, type(value).__name__)
    text = str(value)
    if kind == "text":
        if _control(text):
            return "%s holds control characters (a newline would inject lines into the files it is written to)" % name
        if text.startswith("-"):
            return "%s %r starts with '-', which a command line would read as an option" % (name, text)
        return None
    if kind not in RULES:
        raise AnsibleFilterError("fleet_invalid: unknown kind %r for %s (known: port, secret, text, %s)"
                                 % (kind, name, ", ".join(RULES)))
    pattern, what = RULES[kind]
    if _control(text) or not pattern.match(text) or (kind == "path" and "/../" in text + "/"):
        return "%s must be %s, got %r" % (name, what, text)
    return None


def fleet_invalid(checks, host=None, kind=None, label="value"):
    """Problems with [name, value, kind] triples, each message prefixed with the host. With kind, checks is a plain
    list of values of that kind, named label[i]."""
    if not isinstance(checks, list):
        raise AnsibleFilterError("fleet_invalid takes a list of [name, value, kind], got %s" % type(checks).__name__)
    if kind is not None:
        checks = [["%s[%d]" % (label, i), value, kind] for i, value in enumerate(checks)]
    out = []
    for check in checks:
        if not isinstance(check, (list, tuple)) or len(check) != 3:
            raise AnsibleFilterError("fleet_invalid: each check is [name, value, kind], got %r" % (check,))
        problem = _problem(*check)
        if problem:
            out.append(("%s: %s" % (host, problem)) if host else problem)
    return out


class FilterModule(object):
    """Inventory value checks."""

    def filters(self):
        return {"fleet_invalid": fleet_invalid}
