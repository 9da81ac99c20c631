# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One renderer per output format the roles write, each with that format's own escaping, used by every template:

- systemd unit files: ExecStart words (systemd_exec), Environment= assignments (systemd_environment), other values
  (systemd_value) and comments (systemd_comment);
- EnvironmentFile (env_file);
- haproxy.cfg words (haproxy_word).

Every renderer refuses control characters (a newline would end the line and start another setting, section or
server) and names the input in its error. Documentation is in the sidecar files next to this one.
"""

import re

from ansible.errors import AnsibleFilterError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# HAProxy words the roles write unquoted: names, addresses, ports.
HAPROXY_WORD = re.compile(r"^[A-Za-z0-9_.:\[\]-]+$")


def _text(value, what):
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AnsibleFilterError("%s must be a string or a number, got %s" % (what, type(value).__name__))
    text = str(value)
    bad = sorted({"%r" % c for c in text if ord(c) < 32 or ord(c) == 127})
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


def haproxy_word(value, what="value"):
    """A name, address or port for haproxy.cfg: letters, digits and . _ - : [ ] only, so it stays one word."""
    text = _text(value, what)
    if not HAPROXY_WORD.match(text):
        raise AnsibleFilterError("%s %r is not a single HAProxy word (letters, digits and . _ - : [ ] only)"
                                 % (what, text))
    return text


class FilterModule(object):
    """Renderers with escaping, one per output format."""

    def filters(self):
        return {
            "systemd_exec": systemd_exec,
            "systemd_environment": systemd_environment,
            "systemd_value": systemd_value,
            "systemd_comment": systemd_comment,
            "env_file": env_file,
            "haproxy_word": haproxy_word,
        }
