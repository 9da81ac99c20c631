# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan many hosts in one task on the controller (documentation: library/vllm_fleet_plan.py).

playbooks/plan.yml planned each host with the per-host path (nvidia_gpu's facts, then vllm's plan, each behind its
argument check): four tasks a host, each costing Ansible about its floor of one task a host, so 200 declared hosts
took 7.7 times that floor (2026-12-07). Here each host goes through the same path in one task: its variables as
Ansible gives them to those tasks (the variable manager, with the two roles' defaults), the same argument checks
(the roles' meta/argument_specs.yml) and the same actions with the same arguments (the task files' own, templated
for the host). Only hosts that must be contacted (no declared GPUs, or a
model directory to read config.json from) are left to the per-host path.
"""
from __future__ import annotations

import json
import os

import jinja2
import jinja2.meta
import jinja2.nodes
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.playbook.role import Role
from ansible.playbook.role.include import RoleInclude
from ansible.plugins.action import ActionBase
from ansible.utils.vars import combine_vars

ARGUMENT_SPEC = {"hosts": {"type": "list", "elements": "str", "required": True}}

# Templates whose result may differ between two renderings of the same inputs (lookups, the clock, randomness):
# rendered for each host, as Ansible would.
IMPURE = frozenset(("lookup", "query", "q", "now", "random", "shuffle", "password_hash"))
# Variables that hold the whole fleet or all of a host's variables, too large to key a rendering by: a template that
# reads them is rendered per host.
UNKEYED = frozenset(("hostvars", "vars", "groups", "play_hosts", "ansible_play_hosts", "ansible_play_hosts_all",
                     "ansible_play_batch"))
_PARSER = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])
_MISSING = object()

# The per-host path, in order: (role, entry point and task file, action of that file's task).
STEPS = (("vllm_fleet.fleet.nvidia_gpu", "facts", "vllm_fleet.fleet.nvidia_gpu_facts"),
         ("vllm_fleet.fleet.vllm", "plan", "vllm_fleet.fleet.vllm_plan"))


def task_args(tasks, action):
    """The arguments (raw, untemplated) of the task of a task file that calls action."""
    found = [task[action] for task in tasks or () if isinstance(task, dict) and action in task]
    if len(found) != 1:
        raise AnsibleError("expected one %s task in the task file, found %d" % (action, len(found)))
    return found[0]


def references(source):
    """The variables a template reads, or None when its result may not be reused (impure, unparsable)."""
    try:
        tree = _PARSER.parse(source)
    except jinja2.TemplateSyntaxError:
        return None
    names = jinja2.meta.find_undeclared_variables(tree)
    used = names | {node.name.rsplit(".", 1)[-1] for node in tree.find_all((jinja2.nodes.Filter, jinja2.nodes.Test))}
    return None if used & (IMPURE | UNKEYED) else names


class Renderings:
    """Templating with reuse: what a template renders to depends only on the values of the variables it reads,
    through every template among them, so a host whose values of those are another's gets that host's rendering.
    A fleet has a few distinct configurations and many hosts: each is rendered once, not once a host."""

    def __init__(self, templar):
        self._templar, self._sources, self._done = templar, {}, {}

    def _reads(self, value, found):
        """Adds to found the variables value's templates read; False when it must be rendered per host."""
        if isinstance(value, str):
            if not self._templar.is_possibly_template(value):
                return True
            if value not in self._sources:
                self._sources[value] = references(value)
            names = self._sources[value]
            if names is None:
                return False
            found.update(names)
            return True
        if isinstance(value, dict):
            return all(self._reads(key, found) and self._reads(item, found) for key, item in value.items())
        if isinstance(value, (list, tuple)):
            return all(self._reads(item, found) for item in value)
        return True

    def key(self, data, variables):
        """The values of every variable data reads, directly or through other variables, as a string; None when
        data must be rendered per host."""
        pending, closure = set(), {}
        if not self._reads(data, pending):
            return None
        while pending:
            name = pending.pop()
            if name in closure:
                continue
            closure[name] = variables.get(name, _MISSING)
            if closure[name] is not _MISSING and not self._reads(closure[name], pending):
                return None
        return json.dumps([data, closure], sort_keys=True, default=repr)

    def render(self, tag, data, variables, render):
        """render(data) for these variables, or what it returned for another host that reads the same values."""
        key = self.key(data, variables)
        if key is None:
            return render(data)
        key = (tag, key)
        if key not in self._done:
            self._done[key] = render(data)
        return self._done[key]


class ActionModule(ActionBase):
    """Plans every host it can without contacting it; names the others and the hosts refused."""

    _supports_check_mode = True
    _requires_connection = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def _step(self, play, name, entry, action):
        """What the per-host path's step needs: the role's defaults, its entry point's argument check (as Ansible's
        validate_argument_spec makes it) and its task's args."""
        include = RoleInclude.load(name, play=play, variable_manager=self._task.get_variable_manager(),
                                   loader=self._loader)
        role = Role.load(include, play, from_files={"tasks": entry})
        path = role.get_role_path()
        options = self._loader.load_from_file(
            os.path.join(path, "meta", "argument_specs.yml"))["argument_specs"][entry].get("options", {})
        # The role's own task file, templated as Ansible templates it (not found in the loader's cache of what the
        # play loaded when the role's path is spelled another way, e.g. through the collection's link).
        tasks = self._loader.load_from_file(os.path.join(path, "tasks", entry + ".yml"), trusted_as_template=True)
        return {"name": name, "entry": entry, "action": action, "defaults": role.get_default_vars(),
                "options": options, "validator": ArgumentSpecValidator(options), "args": task_args(tasks, action)}

    def _arguments(self, step, variables):
        """The role's argument check of the host's variables, then its task's args templated for the host. The
        checked variables are rendered once: variables takes their values, which the args then read."""
        templar = self._templar.copy_with_new_env(available_variables=variables)

        def check(given):
            provided = templar.template(given)
            return provided, step["validator"].validate(provided, validate_role_argument_spec=True).error_messages

        given = {key: variables[key] for key in step["options"] if key in variables}
        provided, errors = self._renderings.render((step["name"], "check"), given, variables, check)
        if errors:
            raise AnsibleError("role %s, entry point %s: Validation of arguments failed:\n%s"
                               % (step["name"], step["entry"], "\n".join(errors)))
        variables.update(provided)
        return self._renderings.render((step["name"], "args"), step["args"], variables, templar.template)

    def _execute(self, step, args, variables):
        """The step's action with these args, as the task would run it on the host; its result."""
        task = self._task.copy(exclude_parent=True)
        task.args = args
        action = self._shared_loader_obj.action_loader.get(
            step["action"], task=task, connection=self._connection, play_context=self._play_context,
            loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        result = action.run(task_vars=variables)
        if result.get("failed"):
            raise AnsibleError(result.get("msg", "%s failed" % step["action"]))
        return result

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        play = self._task.get_play()
        manager = self._task.get_variable_manager()
        facts, plan = (self._step(play, *step) for step in STEPS)
        self._renderings = Renderings(self._templar)
        # This task is the vllm role's: the variable manager gives each host the vllm role's defaults and vars and
        # this task's vars; nvidia_gpu's defaults go below them (the lowest precedence, as in the facts task).
        plans, contact, refused = {}, [], {}
        for host in args["hosts"]:
            variables = combine_vars(facts["defaults"], manager.get_vars(
                play=play, host=manager._inventory.get_host(host), task=self._task))
            try:
                gpu_args = self._arguments(facts, variables)
                if not gpu_args["declared"]:  # nvidia-smi on the host
                    contact.append(host)
                    continue
                found = self._execute(facts, gpu_args, variables)
                variables["ansible_facts"] = combine_vars(variables.get("ansible_facts", {}), found["ansible_facts"])
                plan_args = self._arguments(plan, variables)
                if plan_args["model_dir"] and not plan_args["model_config"]:  # config.json is on the host
                    contact.append(host)
                    continue
                plans[host] = self._execute(plan, plan_args, variables)["ansible_facts"]["vllm_plans"]
            except AnsibleError as exc:
                refused[host] = "%s: %s" % (host, exc.message)
        result.update(changed=False, ansible_facts={"vllm_fleet_plan": {
            "hosts": args["hosts"], "plans": plans, "contact": contact, "refused": refused}})
        return result
