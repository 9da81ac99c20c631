"""Every role's README carries the part tools/role_readme.py renders from its defaults and argument specs (issue 27:
a README per role that mirrors its defaults), so a variable added to a role without `make readmes` fails here."""
import os

import pytest
import role_readme

from conftest import ROOT

ROLES_DIR = os.path.join(ROOT, "roles")
ROLES = sorted(d for d in os.listdir(ROLES_DIR) if os.path.isdir(os.path.join(ROLES_DIR, d)))


@pytest.mark.parametrize("role", ROLES)
def test_readme_is_up_to_date(role):
    path = os.path.join(ROLES_DIR, role, "README.md")
    assert os.path.isfile(path), "roles/%s has no README.md: run `make readmes`, then write its first lines" % role
    with open(path, encoding="utf-8") as f:
        section = role_readme.generated_section(f.read())
    assert section == role_readme.render(os.path.join(ROLES_DIR, role)), (
        "roles/%s/README.md does not match its defaults and argument specs: run `make readmes`" % role)


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_listed(role):
    role_dir = os.path.join(ROLES_DIR, role)
    defaults, _ = role_readme.role_files(role_dir)
    rendered = role_readme.render(role_dir)
    assert [name for name in defaults if "| `%s` |" % name not in rendered] == []


def test_role_without_specs_or_defaults(tmp_path):
    """A role being split out may lack either file: what exists is rendered, a default the specs lack is flagged."""
    (tmp_path / "bare").mkdir()
    assert "no entry point" in role_readme.render(str(tmp_path / "bare"))
    (tmp_path / "new" / "defaults").mkdir(parents=True)
    (tmp_path / "new" / "defaults" / "main.yml").write_text("---\n# What it is | why.\nnew_thing: [a, b]\n")
    assert "| `new_thing` |  | `[a, b]` | What it is \\| why. (not in argument_specs) |" in role_readme.render(
        str(tmp_path / "new"))


def test_update_keeps_the_hand_written_part():
    text = "# role\n\nHand-written.\n"
    once = role_readme.updated(text, "generated\n")
    assert once.startswith(text) and role_readme.generated_section(once) == "generated\n"
    twice = role_readme.updated(once + "\nAfter.\n", "new\n")
    assert twice.startswith(text) and twice.endswith("\nAfter.\n") and role_readme.generated_section(twice) == "new\n"
