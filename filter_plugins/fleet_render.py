# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One renderer per output format the roles write, each with that format's own escaping, used by every template,
and the check of inventory values before anything is written (fleet_invalid):

- systemd unit files: ExecStart words (systemd_exec), Environment= assignments (systemd_environment), other values
  (systemd_value) and comments (systemd_comment);
- EnvironmentFile (env_file);
- haproxy.cfg words (haproxy_word);
- keepalived.conf words (keepalived_word).

Every renderer refuses control characters (a newline would end the line and start another setting, section or
server) and names the input in its error. Documentation is in the sidecar files next to this one.
"""

import re

from ansible.errors import AnsibleFilterError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# HAProxy words the roles write unquoted: names, addresses, ports.
HAPROXY_WORD = re.compile(r"^[A-Za-z0-9_.:\[\]-]+$")
# Every other kind of value haproxy.cfg gets from the inventory, each kept to what HAProxy reads as that kind: none
# may hold whitespace, '#', quotes, backslashes or '$' (they split words, start comments or expand variables), so a
# value can never add an argument, a line or a server. "line" is the one free-form kind (the *_extra settings, which
# are configuration on purpose): one line, no control characters.
HAPROXY = {
    "word": (HAPROXY_WORD, "a single HAProxy word (letters, digits and . _ - : [ ] only)"),
    "time": (re.compile(r"^[0-9]{1,9}(us|ms|s|m|h|d)?$"), "an HAProxy time (digits, then us, ms, s, m, h or d)"),
    "path": (re.compile(r"^/[A-Za-z0-9._~%!+,;=:@/-]*$"),
             "a URL path starting with / (letters, digits and . _ ~ % ! + , ; = : @ / - only)"),
    # address:port (IPv6 in brackets; empty or * for every address), then bind options of the same safe words.
    "bind": (re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.*-]*):[0-9]{1,5}( [A-Za-z0-9_.:/@=,+-]+)*$"),
             "address:port, then bind options (letters, digits and . _ : / @ = , + -), single spaces between"),
    # A keyword with an optional argument in brackets: leastconn, random(2), hdr(host); retry-on's 503 too.
    "keyword": (re.compile(r"^[a-z0-9][a-z0-9_-]*(\([A-Za-z0-9_.-]*\))?$"),
                "an HAProxy keyword such as leastconn or conn-failure"),
    "line": (re.compile(r"^[^\x00-\x1f\x7f]*$"), "one line (no newline or other control character)"),
}

# keepalived.conf splits at whitespace, starts a comment at # or ! and reads quotes: its values are kept to single
# words of safe characters, addresses to dotted quads, interfaces to Linux interface names (at most 15 characters).
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
KEEPALIVED = {
    "word": (re.compile(r"^[A-Za-z0-9_.:/@%+=,-]+$"), "a single keepalived word (letters, digits and . _ : / @ % + = , -)"),
    "ipv4": (re.compile(r"^(%s\.){3}%s$" % (_OCTET, _OCTET)), "an IPv4 address such as 10.0.0.100"),
    "ifname": (re.compile(r"^[A-Za-z0-9_.-]{1,15}$"), "a network interface name such as eth0 (at most 15 characters)"),
}
# The value kinds fleet_invalid knows by a renderer's prefix: haproxy_time, keepalived_ipv4...
RENDERED = {"haproxy": HAPROXY, "keepalived": KEEPALIVED}


def _control(text):
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _text(value, what):
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AnsibleFilterError("%s must be a string or a number, got %s" % (what, type(value).__name__))
    text = str(value)
    bad = sorted({"%r" % c for c in text if _control(c)})
    if bad:
        # The value is not printed: it may be a secret.
        raise AnsibleFilterError("%s holds control characters (%s): a newline or similar would end the line and "
                                 "inject another setting; remove them" % (what, ", ".join(bad)))
    return text


def _unit_quote(text, exec_line):
    """A double-quoted word of a unit file: C escapes for \\ and ", %% for specifiers, $$ where variables expand."""
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if exec_line:
        text = text.replace("$", "$$")
    return '"%s"' % text


def systemd_exec(words, what="command line"):
    """The value of an Exec*= setting: each word quoted so that systemd passes it as one argument, verbatim."""
    if isinstance(words, (str, int, float)):
        words = [words]
    if not isinstance(words, list) or not words:
        raise AnsibleFilterError("%s must be a non-empty list of words, got %r" % (what, type(words).__name__))
    return " ".join(_unit_quote(_text(w, "%s word %d" % (what, i)), True) for i, w in enumerate(words))


def _variables(env, what):
    """(name, value) of a dict of environment variables, sorted, both checked."""
    if not isinstance(env, dict):
        raise AnsibleFilterError("%s must be a dict of variables, got %s" % (what, type(env).__name__))
    for key in sorted(env, key=str):
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise AnsibleFilterError("%s: %r is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)" % (what, key))
        yield key, _text(env[key], "%s.%s" % (what, key))


def systemd_environment(env, what="environment"):
    """Environment= lines, one per variable, sorted: each value reaches the process verbatim."""
    return "\n".join("Environment=" + _unit_quote("%s=%s" % item, False) for item in _variables(env, what))


def systemd_value(value, what="value"):
    """A single-word unit setting value (a path, a user, a number): no whitespace, quotes or backslashes, %% for
    specifiers."""
    text = _text(value, what)
    if not text or any(c in text for c in " \t\"'\\"):
        raise AnsibleFilterError("%s %r is empty or holds whitespace, quotes or backslashes, which systemd would "
                                 "split or unescape" % (what, text))
    return text.replace("%", "%%")


def systemd_comment(value):
    """Free text for a comment line: control characters become spaces, no trailing backslash."""
    text = re.sub(r"[\x00-\x1f\x7f]", " ", str(value))
    return text.rstrip("\\ ")


def env_file(env, what="environment file"):
    """The lines of a systemd EnvironmentFile: KEY="value" with \\ before the characters systemd unescapes in double
    quotes (\\ " ` $), so the process sees the value verbatim, surrounding spaces included."""
    return "\n".join('%s="%s"' % (key, re.sub(r'([\\"`$])', r"\\\1", value)) for key, value in _variables(env, what))


def haproxy_word(value, what="value", kind="word"):
    """A value for haproxy.cfg that stays what it is (HAPROXY): by default a name, address or port, one word of
    letters, digits and . _ - : [ ]; a time, a URL path, bind arguments, a keyword or a whole line by `kind`."""
    if kind not in HAPROXY:
        raise AnsibleFilterError("haproxy_word: unknown kind %r for %s (known: %s)" % (kind, what, ", ".join(HAPROXY)))
    text = _text(value, what)
    pattern, wanted = HAPROXY[kind]
    if not pattern.fullmatch(text) or (kind != "line" and not text):
        raise AnsibleFilterError("%s %r is not %s" % (what, text, wanted))
    return text


def keepalived_word(value, what="value", kind="word"):
    """A value for keepalived.conf that stays one value (KEEPALIVED): a word, an IPv4 address or an interface."""
    if kind not in KEEPALIVED:
        raise AnsibleFilterError("keepalived_word: unknown kind %r for %s (known: %s)" % (
            kind, what, ", ".join(KEEPALIVED)))
    text = _text(value, what)
    pattern, wanted = KEEPALIVED[kind]
    if not pattern.fullmatch(text):
        raise AnsibleFilterError("%s %r is not %s" % (what, text, wanted))
    return text


# --- fleet_invalid: inventory values checked at the door (messages name the variable, never a secret) -----

RULES = {
    # systemd instance names, server names: one word, no path separators, no leading dot or dash.
    "name": (re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"),
             "a name of letters, digits and . _ - (at most 64, starting with a letter or digit)"),
    "user": (re.compile(r"^[a-z_][a-z0-9_-]{0,31}$"), "a Unix user name ([a-z_][a-z0-9_-]*)"),
    "path": (re.compile(r"^(/[A-Za-z0-9_.@+-]+)+/?$|^/$"),
             "an absolute path of letters, digits and . _ - @ + (no spaces, no ..)"),
    "host": (HAPROXY_WORD, "a host name or IP address"),
    "env": (ENV_NAME, "an environment variable name"),
    # A command-line option of a daemon started with $ARGS from an EnvironmentFile: systemd splits at whitespace
    # and passes no quotes, so an option must be one word.
    "flag": (re.compile(r"^--[A-Za-z0-9][A-Za-z0-9._-]*(=\S*)?$"),
             "one word starting with -- (--name or --name=value)"),
    # A package pip installs: pinned, as vLLM itself, so that a run never upgrades anything on its own.
    "pin": (re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$"),
            "a package pinned as NAME==VERSION (or NAME[EXTRA]==VERSION)"),
}


def _problem(name, value, kind):
    """None if value is a valid `kind`, else what is wrong (without the value when it is a secret)."""
    if kind == "port":
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            return "%s must be a port number from 1 to 65535, got %r" % (name, value)
        return None
    if kind == "count":
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return "%s must be a whole number of at least 1, got %r" % (name, value)
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
    renderer, _sep, sub = kind.partition("_")
    if sub in RENDERED.get(renderer, {}):
        pattern, what = RENDERED[renderer][sub]
    elif kind in RULES:
        pattern, what = RULES[kind]
    else:
        raise AnsibleFilterError("fleet_invalid: unknown kind %r for %s (known: port, count, secret, text, %s, %s)" % (
            kind, name, ", ".join(RULES),
            ", ".join("%s_%s" % (r, k) for r, kinds in RENDERED.items() for k in kinds)))
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
    """Renderers with escaping, one per output format, and the check of the values they get."""

    def filters(self):
        return {
            "systemd_exec": systemd_exec,
            "systemd_environment": systemd_environment,
            "systemd_value": systemd_value,
            "keepalived_word": keepalived_word,
            "systemd_comment": systemd_comment,
            "env_file": env_file,
            "haproxy_word": haproxy_word,
            "fleet_invalid": fleet_invalid,
        }
