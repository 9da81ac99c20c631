# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's one rule for what a vLLM instance is called (fleet_servers) and where its host is reached
(fleet_address), shared by the balancer's backends and the monitoring role's scrape targets so that they agree; and
the roll's batches (fleet_batches). Documentation is in the sidecar files next to this one."""

from ansible.errors import AnsibleFilterError


def fleet_address(host, hostvars):
    """Where HAProxy and Prometheus reach a vLLM host: balancer_backend_address, else ansible_host, else its name."""
    hv = hostvars[host]
    for key in ("balancer_backend_address", "ansible_host"):
        if key in hv:
            return hv[key]
    return host


def fleet_servers(hosts, hostvars, default_instances):
    """One entry per host x instance of its vllm_instances: the instance's keys (name, port, gpus...) plus host,
    address and server ("<host>-<name>")."""
    if not isinstance(hosts, list):
        raise AnsibleFilterError("fleet_servers takes a list of inventory host names, got %s" % type(hosts).__name__)
    out = []
    for host in hosts:
        hv = hostvars[host]
        instances = hv["vllm_instances"] if "vllm_instances" in hv else default_instances
        if not isinstance(instances, list):
            raise AnsibleFilterError("host %s: vllm_instances must be a list of {name, port}, got %s"
                                     % (host, type(instances).__name__))
        address = fleet_address(host, hostvars)
        for i, inst in enumerate(instances):
            if not isinstance(inst, dict) or "name" not in inst or "port" not in inst:
                raise AnsibleFilterError("host %s: vllm_instances[%d] must be a dict with name and port, got %r"
                                         % (host, i, inst))
            out.append(dict(inst, host=host, address=address, server="%s-%s" % (host, inst["name"])))
    return out


def fleet_batches(hosts, hostvars, batch_by="", serial=None):
    """The roll's host order and Ansible `serial`: the hosts and serial as given (default 1) without batch_by; with
    it, one batch per failure domain (the hosts sharing a value of that host variable, in order of first appearance),
    as a list of batch sizes."""
    if not isinstance(hosts, list):
        raise AnsibleFilterError("fleet_batches takes a list of inventory host names, got %s" % type(hosts).__name__)
    if not batch_by:
        return {"hosts": hosts, "serial": 1 if serial is None else serial, "domains": []}
    if serial is not None:
        raise AnsibleFilterError("rolling_restart_batch_by (%s) and rolling_restart_serial (%s) both set: a batch is a"
                                 " failure domain or a number of hosts, set one of them" % (batch_by, serial))
    missing = [host for host in hosts if batch_by not in hostvars[host]]
    if missing:
        raise AnsibleFilterError("rolling_restart_batch_by is %s, which host(s) %s do not set: give every vLLM host"
                                 " its %s (a host variable), or roll them without batch_by"
                                 % (batch_by, ", ".join(missing), batch_by))
    domains = {}
    for host in hosts:
        value = hostvars[host][batch_by]
        if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value) == "":
            raise AnsibleFilterError("host %s: %s must be a name or a number (its failure domain), got %r"
                                     % (host, batch_by, value))
        domains.setdefault(str(value), []).append(host)
    return {"hosts": [host for members in domains.values() for host in members],
            "serial": [len(members) for members in domains.values()], "domains": list(domains)}


class FilterModule(object):
    """The fleet's naming and address rules for vLLM instances."""

    def filters(self):
        return {"fleet_servers": fleet_servers, "fleet_address": fleet_address, "fleet_batches": fleet_batches}
