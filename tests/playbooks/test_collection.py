"""The collection as ansible-galaxy builds and installs it, away from this checkout: its playbook plans the same
fleet the same way (its roles find their modules, actions, filters and each other by fully qualified name, not
through this checkout's ansible.cfg), and ansible-doc finds every module's documentation there."""
import json
import os
import shutil
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, ".venv", "bin")


def ansible(tool, *args, cwd, config):
    run = subprocess.run([os.path.join(BIN, tool), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                         check=False, env=dict(os.environ, ANSIBLE_CONFIG=config, ANSIBLE_FORCE_COLOR="0"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run.stdout


def plans(tmp_path, playbook, cwd, config):
    out = tmp_path / ("%s.json" % os.path.basename(cwd))
    ansible("ansible-playbook", "-i", str(tmp_path / "plan-inventory.yml"), playbook, "-e", "plan_out=%s" % out,
            cwd=cwd, config=config)
    return json.loads(out.read_text())


def test_the_installed_collection_plans_as_the_checkout_does(tmp_path):
    checkout_config = os.path.join(ROOT, "ansible.cfg")
    ansible("ansible-galaxy", "collection", "build", ROOT, "--output-path", str(tmp_path), cwd=str(tmp_path),
            config=checkout_config)
    (tarball,) = tmp_path.glob("vllm_fleet-fleet-*.tar.gz")
    # Elsewhere, with only the installed collection: no roles_path, no filter_plugins, no link to this checkout.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = elsewhere / "ansible.cfg"
    config.write_text("[defaults]\ncollections_path = %s\n" % (tmp_path / "installed"))
    ansible("ansible-galaxy", "collection", "install", "--force", "-p", str(tmp_path / "installed"), str(tarball),
            cwd=str(elsewhere), config=str(config))
    installed = tmp_path / "installed" / "ansible_collections" / "vllm_fleet" / "fleet"
    assert (installed / "plugins" / "modules" / "vllm_plan.py").is_file() and not (installed / "tests").exists()
    shutil.copy(os.path.join(ROOT, "tests", "playbooks", "plan-inventory.yml"), tmp_path)

    there = plans(tmp_path, "vllm_fleet.fleet.plan", str(elsewhere), str(config))
    here = plans(tmp_path, "playbooks/plan.yml", ROOT, checkout_config)
    assert there == here and there["h100x8-gptoss"]["main"]["fits"]

    for module in sorted(os.listdir(installed / "plugins" / "modules")):
        name = "vllm_fleet.fleet." + module[:-len(".py")]
        doc = json.loads(ansible("ansible-doc", "--json", name, cwd=str(elsewhere), config=str(config)))
        assert doc[name]["doc"]["short_description"], name
