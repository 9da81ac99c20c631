#!/usr/bin/env python3
"""Write the generated part of each role's README from the role's own files (issue 27: a README per role that
mirrors its defaults).

    python3 tools/role_readme.py [--check] [ROLE ...]      (no ROLE: every directory under roles/)

The part between the markers BEGIN and END (below) lists the role's entry points (meta/argument_specs.yml) and a
table of every variable: the argument specs' options (main's, then those only other entry points take) and anything
else defaults/main.yml sets, with its type, its default as defaults/main.yml writes it and its description.
Everything outside the markers is hand-written and kept. --check rewrites nothing and exits 1 naming every README
whose part is out of date or missing (tests/unit/test_role_readmes.py does the same; `make readmes` fixes it).
"""
import argparse
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES = os.path.join(ROOT, "roles")
COLLECTION = "vllm_fleet.fleet"
BEGIN = "<!-- BEGIN GENERATED: tools/role_readme.py -->"
END = "<!-- END GENERATED -->"
# A default longer than this in its inline form would stretch the table: the reader is sent to the file instead.
MAX_DEFAULT = 80


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads Ansible's own tags (!unsafe, !vault) as their plain value instead of failing."""


def _untagged(loader, _suffix, node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_scalar(node)


_Loader.add_multi_constructor("!", _untagged)


def _load(path):
    """The mapping at path; {} when the file does not exist or holds no mapping (a role need not have every file,
    and one being split out may have them half-written)."""
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = yaml.load(f, Loader=_Loader)
    return data if isinstance(data, dict) else {}


def role_files(role_dir):
    """(defaults, argument_specs) of a role, each {} when the role has none. Ansible also accepts .yaml names and
    the specs under meta/main.yml's argument_specs, so those are read too."""
    defaults = _load(os.path.join(role_dir, "defaults", "main.yml")) or _load(
        os.path.join(role_dir, "defaults", "main.yaml"))
    specs = {}
    for name in ("argument_specs.yml", "argument_specs.yaml", "main.yml"):
        specs = specs or _load(os.path.join(role_dir, "meta", name)).get("argument_specs") or {}
    return defaults, specs


def default_comments(role_dir):
    """{variable: the comment lines just above it in defaults/main.yml}, the only description a variable the specs
    lack has. Section rulers ("# --- ...") and a blank line end a comment."""
    path = os.path.join(role_dir, "defaults", "main.yml")
    comments, block = {}, []
    if not os.path.isfile(path):
        return comments
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = re.match(r"([A-Za-z_][A-Za-z0-9_]*):", line)
            if line.startswith("#") and not line.startswith("# ---"):
                block.append(line[1:].strip())
            elif match:
                comments[match.group(1)] = " ".join(block)
                block = []
            elif not line.startswith((" ", "-")):  # a continuation of a value keeps the comment of the next key
                block = []
    return comments


def _cell(text):
    """One line of a Markdown table cell: whitespace collapsed; Ansible's markup O(x), C(x), V(x)... as code; | escaped
    (a column break otherwise, even in code); < escaped outside code (GitHub would take "<name>" for an HTML tag and
    hide it; in code a backslash would show)."""
    text = re.sub(r"\b[BCEIMOPRUV]\(([^()`]*)\)", r"`\1`", " ".join(str(text).split())).replace("|", "\\|")
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("<", "\\<") for i, p in enumerate(parts))


def _description(spec):
    text = spec.get("description", "")
    return " ".join(text) if isinstance(text, list) else str(text or "")


def _inline(value):
    """A default as one would write it in YAML, inline (flow style, keys in file order); long ones shortened."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=float("inf"), allow_unicode=True)
    text = text.strip().removesuffix("...").strip()
    if len(text) > MAX_DEFAULT or "`" in text or "\n" in text:
        return "see defaults/main.yml"
    return "`%s`" % text.replace("|", "\\|")


def _type(spec):
    kind = spec.get("type", "str")  # Ansible's default type
    if spec.get("elements"):
        kind += " of " + spec["elements"]
    return kind + (", required" if spec.get("required") else "")


def _rows(name, spec, default, note):
    """The table rows of one option: its own, then one per nested option (name.key, or name[].key in a list)."""
    if not isinstance(spec, dict):
        spec = {}
    text = _description(spec)
    if spec.get("choices"):
        text += " Choices: %s." % ", ".join("`%s`" % c for c in spec["choices"])
    rows = ["| `%s` | %s | %s | %s |" % (name, _cell(_type(spec)), default, _cell((text + note).strip()))]
    sub = "[]." if spec.get("type") == "list" else "."
    for key, subspec in (spec.get("options") or {}).items():
        subspec = subspec if isinstance(subspec, dict) else {}
        subdefault = _inline(subspec["default"]) if "default" in subspec else ""
        rows += _rows(name + sub + key, subspec, subdefault, "")
    return rows


def variables(role_dir):
    """[(name, spec, where)] for every variable of the role, in table order: main's options, then the options of the
    other entry points (where: the entry points that take it), then defaults set nowhere in the specs (spec None)."""
    defaults, specs = role_files(role_dir)
    seen, out = set(), []
    for entry in sorted(specs, key=lambda e: e != "main"):  # main first, the others in file order
        for name, spec in ((specs[entry] or {}).get("options") or {}).items():
            if name not in seen:
                seen.add(name)
                others = [e for e in specs if e != "main" and name in ((specs[e] or {}).get("options") or {})]
                out.append((name, spec, [] if entry == "main" else others))
    out += [(name, None, []) for name in defaults if name not in seen]
    return out


def render(role_dir):
    """The generated Markdown of one role (what goes between the markers, without them)."""
    role = os.path.basename(os.path.normpath(role_dir))
    defaults, specs = role_files(role_dir)
    comments = default_comments(role_dir)
    lines = ["## Entry points (meta/argument_specs.yml)", ""]
    for entry in sorted(specs, key=lambda e: e != "main"):
        short = _cell((specs[entry] or {}).get("short_description", ""))
        if entry == "main":
            lines.append(("- `main`: %s" % short).rstrip())
        else:
            stop = "" if short.endswith((".", ")", "`")) or not short else "."
            lines += [("- `%s`: %s%s" % (entry, short, stop)).rstrip(),
                      "  `include_role: {name: %s.%s, tasks_from: %s}`" % (COLLECTION, role, entry)]
    if not specs:
        lines.append("No meta/argument_specs.yml: no entry point is declared.")
    lines += ["", "## Variables (defaults/main.yml)", "",
              "Defaults as `defaults/main.yml` sets them; types and descriptions from `meta/argument_specs.yml`;",
              "`a.b` is key `b` of dict `a`, `a[].b` key `b` of each item of list `a`.", "",
              "| variable | type | default | description |", "|---|---|---|---|"]
    for name, spec, where in variables(role_dir):
        default = _inline(defaults[name]) if name in defaults else (
            _inline(spec["default"]) if isinstance(spec, dict) and "default" in spec else "")
        if spec is None:
            spec, note = {"type": "", "description": comments.get(name, "")}, " (not in argument_specs)"
        else:
            note = " Entry points: %s." % ", ".join("`%s`" % e for e in where) if where else ""
        lines += _rows(name, spec, default, note)
    return "\n".join(lines) + "\n"


def generated_section(text):
    """The text between the markers of a README (None when it has none)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[start + len(BEGIN):end].strip("\n") + "\n"


def updated(text, section):
    """The README text with its generated part replaced (or appended, markers and all, when it has none)."""
    block = "%s\n\n%s\n%s" % (BEGIN, section.rstrip("\n"), END)
    if generated_section(text) is None:
        return text.rstrip("\n") + "\n\n" + block + "\n"
    start, end = text.find(BEGIN), text.find(END) + len(END)
    return text[:start] + block + text[end:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a README's generated part is out of date")
    parser.add_argument("roles", nargs="*", help="role names (default: every directory under roles/)")
    args = parser.parse_args(argv)
    roles = args.roles or sorted(d for d in os.listdir(ROLES) if os.path.isdir(os.path.join(ROLES, d)))
    stale = []
    for role in roles:
        role_dir = os.path.join(ROLES, role)
        if not os.path.isdir(role_dir):
            parser.error("no role %s under %s" % (role, ROLES))
        path = os.path.join(role_dir, "README.md")
        old = "# %s\n" % role  # a new role's README: its title, then the generated part
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                old = f.read()
        section = render(role_dir)
        if generated_section(old) == section:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if not args.check:
            with open(path, "w", encoding="utf-8") as f:
                f.write(updated(old, section))
    if args.check and stale:
        print("out of date (run `make readmes`): " + ", ".join(stale), file=sys.stderr)
        return 1
    for path in stale:
        print("wrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
