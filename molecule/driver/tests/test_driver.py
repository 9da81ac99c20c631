"""The nvidia_gpu role's driver install, after converge (and idempotence) left both GPU hosts with the driver
installed from repo-1's repository (the A10G host through a proxy) and a reboot pending. In order: what is
configured and installed, the pending reboot, a "reboot" (the module appears in sysfs) and the converge that
finishes the job and then does nothing, a driver change that waits while vLLM runs and applies once it is stopped
(as in the rolling restart), a clear failure when a GPU is missing, and NVLSM on an NVLink 5 board (the HGX host
shown as an HGX B200 for a while)."""
import re

from fleet import playbook, sh

CONVERGE = "molecule/driver/converge.yml"
REPO = "http://repo-1/compute/cuda/repos/debian12/x86_64/"
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
SOURCE = "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"
PENDING = "/run/nvidia-gpu-reboot-pending"
# converge.yml: the newest of branch 550 on the A10G host (560.35.03 is in the repository too), an exact older
# version on the HGX host.
WANTED = {"gpu-a10g": "550.144.03", "gpu-hgx": "550.127.08"}
GPUS = {"gpu-a10g": ["NVIDIA A10G"], "gpu-hgx": ["NVIDIA H100 80GB HBM3"] * 8}
DRIVER_PACKAGES = {"cuda-drivers-550", "nvidia-driver", "nvidia-smi", "nvidia-kernel-dkms", "nvidia-persistenced"}


def version(host, package):
    out = sh(host, f"dpkg-query --showformat='${{db:Status-Status}} ${{Version}}' --show {package}", check=False)
    return out.stdout.split()[1] if out.stdout.startswith("installed ") else None


def recap(out, host):
    match = re.search(rf"{host} : ok=(\d+) changed=(\d+) unreachable=(\d+) failed=(\d+)", out.stdout)
    assert match, out.stdout[-3000:]
    return {"ok": int(match[1]), "changed": int(match[2]), "failed": int(match[4])}


def query_gpus(host):
    return sh(host, "nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader,nounits", check=False)


def test_repository_and_key_come_from_the_keyring_package():
    fingerprint = sh("repo-1", "cat /srv/nvidia-repo/fingerprint").stdout.strip()
    for host in WANTED:
        assert sh(host, f"cat {SOURCE}").stdout.strip() == f"deb [signed-by={KEYRING}] {REPO} /"
        assert sh(host, f"dpkg-query --search {SOURCE} {KEYRING}").stdout.split(":")[0] == "cuda-keyring"
        # apt fetched the signed index and checked it with that key only.
        check = sh(host, f"gpgv --keyring {KEYRING} /var/lib/apt/lists/repo-1_*InRelease 2>&1")
        assert "Good signature" in check.stdout and fingerprint in check.stdout.replace(" ", ""), check.stdout
        # Only the CUDA repository's source: the test talks to repo-1 and to no other address.
        update = sh(host, f"apt-get update -o Dir::Etc::sourcelist={SOURCE} -o Dir::Etc::sourceparts=- "
                          "-o APT::Get::List-Cleanup=0 2>&1")
        # apt names a flat repository ("deb URL /") without the trailing slash.
        assert f"{REPO.rstrip('/')}  InRelease" in update.stdout and not re.search(r"NO_PUBKEY|not signed|W: ", update.stdout), update.stdout


def test_the_proxy_carries_the_downloads_of_the_host_that_has_one():
    """gpu-a10g has nvidia_gpu_proxy (Debian's tinyproxy on repo-1): the keyring package, the repository's index
    and the driver packages came through it. gpu-hgx has none and went to repo-1 directly."""
    log = sh("repo-1", "journalctl -u tinyproxy -o cat").stdout
    for path in ("cuda-keyring_1.1-1_all.deb", "InRelease", f"nvidia-smi_{WANTED['gpu-a10g']}-1_amd64.deb"):
        # apt asks for a flat repository's packages as "./name".
        assert re.search(rf"GET {re.escape(REPO)}(\./)?{re.escape(path)} ", log), (path, log[-3000:])
    assert f"nvidia-smi_{WANTED['gpu-hgx']}-1_amd64.deb" not in log
    clients = set(re.findall(r"Connect \(file descriptor \d+\): (\S+)", log))
    address = {host: sh(host, "hostname -I").stdout.split()[0] for host in WANTED}
    assert address["gpu-a10g"] in clients and address["gpu-hgx"] not in clients, (clients, address)


def test_driver_is_installed_at_the_wanted_version_pinned_and_held():
    for host, wanted in WANTED.items():
        for package in DRIVER_PACKAGES:
            assert version(host, package) == f"{wanted}-1", (host, package)
        held = set(sh(host, "apt-mark showhold").stdout.split())
        assert DRIVER_PACKAGES <= held, (host, held)
        pin = sh(host, "cat /etc/apt/preferences.d/nvidia-gpu-driver").stdout
        assert "Package: *nvidia* cuda-drivers*" in pin and "Pin-Priority: 1000" in pin
        # Newer driver packages are right there: the pin keeps them out, and an upgrade moves nothing.
        policy = sh(host, "apt-cache policy nvidia-smi").stdout
        assert "560.35.03-1" in policy and f"Candidate: {wanted}-1" in policy, policy
        upgrade = sh(host, "apt-get --simulate dist-upgrade").stdout
        assert not re.search(r"^Inst (nvidia|cuda-drivers)", upgrade, re.M), upgrade
    # Without the exact version, the pin is the branch.
    assert "Pin: version 550.*" in sh("gpu-a10g", "cat /etc/apt/preferences.d/nvidia-gpu-driver").stdout
    assert "Pin: version 550.127.08-*" in sh("gpu-hgx", "cat /etc/apt/preferences.d/nvidia-gpu-driver").stdout


def test_fabric_manager_only_on_the_nvswitch_host_at_the_driver_version():
    # 550.144.03 of Fabric Manager is in the repository: the driver's exact version was taken.
    assert version("gpu-hgx", "nvidia-fabricmanager-550") == "550.127.08-1"
    assert "nvidia-fabricmanager-550" in sh("gpu-hgx", "apt-mark showhold").stdout
    assert sh("gpu-hgx", "systemctl is-enabled nvidia-fabricmanager").stdout.strip() == "enabled"
    assert version("gpu-a10g", "nvidia-fabricmanager-550") is None
    # DCGM, asked for on the HGX host only.
    assert sh("gpu-hgx", "systemctl is-enabled nvidia-dcgm").stdout.strip() == "enabled"
    assert version("gpu-a10g", "datacenter-gpu-manager") is None


def test_nouveau_is_blacklisted_and_persistenced_enabled():
    for host in WANTED:
        blacklist = sh(host, "cat /etc/modprobe.d/blacklist-nouveau.conf").stdout
        assert "blacklist nouveau" in blacklist and "options nouveau modeset=0" in blacklist
        assert sh(host, "systemctl is-enabled nvidia-persistenced").stdout.strip() == "enabled"
        exec_start = sh(host, "systemctl show -p ExecStart nvidia-persistenced").stdout
        assert "--persistence-mode" in exec_start and "--no-persistence-mode" not in exec_start, exec_start


def test_the_reboot_is_pending_and_nothing_is_started_before_it():
    for host, wanted in WANTED.items():
        assert sh(host, f"cat {PENDING}").stdout == f"installed={wanted}\nloaded=\n"
        gpus = query_gpus(host)
        assert gpus.returncode == 9 and "couldn't communicate with the NVIDIA driver" in gpus.stdout
        assert sh(host, "systemctl is-active nvidia-persistenced", check=False).stdout.strip() == "inactive"


def test_after_the_reboot_the_role_starts_the_services_and_checks_the_gpus():
    for host, wanted in WANTED.items():
        # What the reboot does here: the installed module is loaded. And the blacklist is gone, to see the
        # initramfs rebuilt when the role puts it back.
        sh(host, f"mkdir -p /sys/module/nvidia && echo {wanted} > /sys/module/nvidia/version"
                 " && rm /etc/modprobe.d/blacklist-nouveau.conf")
    out = playbook(CONVERGE)
    assert out.returncode == 0, out.stdout[-3000:]
    assert out.stdout.count("RUNNING HANDLER [vllm_fleet.fleet.nvidia_gpu : Update initramfs]") == 1
    assert "RUNNING HANDLER [vllm_fleet.fleet.nvidia_gpu : Reboot to load the NVIDIA driver]" not in out.stdout
    for host, wanted in WANTED.items():
        assert sh(host, f"test -e {PENDING}", check=False).returncode == 1
        assert sh(host, "systemctl is-active nvidia-persistenced").stdout.strip() == "active"
        rows = [line.split(", ") for line in query_gpus(host).stdout.splitlines()]
        assert [row[1] for row in rows] == GPUS[host] and {row[2] for row in rows} == {wanted}
    assert sh("gpu-hgx", "systemctl is-active nvidia-fabricmanager nvidia-dcgm").stdout.split() == ["active"] * 2
    assert "4 NVSwitch" in sh("gpu-hgx", "journalctl -u nvidia-fabricmanager -o cat").stdout

    # The wanted driver installed and loaded: the next run does no package work and changes nothing.
    again = playbook(CONVERGE)
    assert again.returncode == 0, again.stdout[-3000:]
    assert {host: recap(again, host)["changed"] for host in WANTED} == {"gpu-a10g": 0, "gpu-hgx": 0}
    assert "TASK [vllm_fleet.fleet.nvidia_gpu : Install the driver packages]" not in again.stdout
    assert "TASK [vllm_fleet.fleet.nvidia_gpu : Add NVIDIA's CUDA repository (cuda-keyring)]" not in again.stdout

    # A driver that needs no work but lost its pin and hold (as one from an image or a hand install has none):
    # the run puts them back, still without package work.
    sh("gpu-a10g", "apt-mark unhold nvidia-smi nvidia-driver && rm /etc/apt/preferences.d/nvidia-gpu-driver")
    held = playbook(CONVERGE, "--limit", "gpu-a10g")
    assert held.returncode == 0, held.stdout[-3000:]
    assert "TASK [vllm_fleet.fleet.nvidia_gpu : Install the driver packages]" not in held.stdout
    # The pin and the hold (one task of several packages), nothing else.
    assert recap(held, "gpu-a10g")["changed"] == 2, held.stdout[-3000:]
    assert DRIVER_PACKAGES <= set(sh("gpu-a10g", "apt-mark showhold").stdout.split())
    assert "Pin: version 550.*" in sh("gpu-a10g", "cat /etc/apt/preferences.d/nvidia-gpu-driver").stdout


def test_a_driver_change_waits_while_vllm_serves_and_applies_once_it_is_stopped():
    host, new = "gpu-a10g", "550.127.08"
    sh(host, "printf '[Service]\\nExecStart=/bin/sleep infinity\\n' > /etc/systemd/system/vllm@.service"
             " && systemctl daemon-reload && systemctl start vllm@main")
    try:
        out = playbook(CONVERGE, "--limit", host, "-e", f"nvidia_gpu_driver_version={new}")
        assert out.returncode == 0, out.stdout[-3000:]
        assert "but vllm@main.service use the GPUs (nvidia_gpu_busy_units): nothing changed" in out.stdout
        assert recap(out, host)["changed"] == 0
        assert version(host, "nvidia-smi") == "550.144.03-1"
    finally:
        # What the rolling restart does before it applies the driver (rolling_restart_apply_driver).
        sh(host, "systemctl stop vllm@main")
    out = playbook(CONVERGE, "--limit", host, "-e", f"nvidia_gpu_driver_version={new}")
    assert out.returncode == 0, out.stdout[-3000:]
    assert {package: version(host, package) for package in DRIVER_PACKAGES} == dict.fromkeys(DRIVER_PACKAGES, new + "-1")
    assert DRIVER_PACKAGES <= set(sh(host, "apt-mark showhold").stdout.split())
    # The old module is still loaded: a reboot is needed, and nvidia-smi says why the GPUs cannot be read.
    assert sh(host, f"cat {PENDING}").stdout == f"installed={new}\nloaded=550.144.03\n"
    gpus = query_gpus(host)
    assert gpus.returncode == 18 and "Driver/library version mismatch" in gpus.stdout


def test_a_missing_gpu_fails_naming_the_host():
    out = playbook(CONVERGE, "--limit", "gpu-hgx", "-e", "nvidia_gpu_expected_count=4")
    assert out.returncode != 0
    assert "gpu-hgx has 8 GPU(s), nvidia_gpu_expected_count is 4" in out.stdout, out.stdout[-3000:]


def test_nvlsm_only_on_an_nvlink5_board_started_by_fabric_manager_first():
    # Nowhere yet: the H100 board's NVSwitches are on the PCI bus, no CX7 bridge; the A10G host has neither.
    for host in WANTED:
        assert version(host, "nvlsm") is None, host
        assert sh(host, "test -e /etc/modules-load.d/nvidia-gpu-nvlsm.conf", check=False).returncode == 1
    host, wanted = "gpu-hgx", WANTED["gpu-hgx"]
    # The HGX host as an HGX B200 board: no NVSwitch on the PCI bus, a CX7 bridge whose two limited functions say
    # SMDL=SW_MNG in their VPD, and a compute-network ConnectX-7 that does not.
    sh(host, "mount --bind /srv/pci/hgx-b200-8 /sys/bus/pci/devices")
    try:
        # This kernel has no InfiniBand modules: the module the role loads is there as modprobe would leave it.
        sh(host, "mkdir -p /sys/module/ib_umad")
        out = playbook(CONVERGE, "--limit", host)
        assert out.returncode == 0, out.stdout[-3000:]
        assert version(host, "nvlsm") == "2025.06.5-1"
        assert "nvlsm" in sh(host, "apt-mark showhold").stdout.split()
        assert sh(host, "cat /etc/modules-load.d/nvidia-gpu-nvlsm.conf").stdout.splitlines()[-1] == "ib_umad"
        # The driver did not move, and Fabric Manager still matches it.
        assert version(host, "nvidia-smi") == version(host, "nvidia-fabricmanager-550") == f"{wanted}-1"
        # Restarted for NVLSM: its unit started NVLSM (OpenSM's log, as master) before configuring the fabric.
        # (The H100 board's runs of the unit printed none of these lines.)
        journal = "journalctl -u nvidia-fabricmanager -o cat"
        log = sh(host, f"for i in $(seq 10); do {journal} | grep -q 'GPUs and NVSwitches' && break; sleep 1; done;"
                       f" {journal}").stdout.splitlines()
        order = [next(i for i, line in enumerate(log) if text in line) for text in
                 ("Detected NVL5+ system", "OpenSM 2025.06.5", "Entering MASTER state",
                  "Successfully configured all the available GPUs and NVSwitches")]
        assert order == sorted(order), log
        assert "(2 CX7 LPF" in log[order[-1]], log
        assert sh(host, "systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
        assert sh(host, "pgrep --exact nvlsm", check=False).returncode == 0
        # Then nothing to do.
        again = playbook(CONVERGE, "--limit", host)
        assert again.returncode == 0, again.stdout[-3000:]
        assert recap(again, host)["changed"] == 0
        assert "TASK [vllm_fleet.fleet.nvidia_gpu : Install NVLSM]" not in again.stdout
    finally:
        # Back to the H100 board, as the other tests left it.
        sh(host, "umount /sys/bus/pci/devices; apt-get purge --yes --allow-change-held-packages nvlsm;"
                 " rm -f /etc/modules-load.d/nvidia-gpu-nvlsm.conf; rmdir /sys/module/ib_umad;"
                 " systemctl restart nvidia-fabricmanager", check=False)
    back = sh(host, "for i in $(seq 10); do journalctl -u nvidia-fabricmanager -o cat -n 1 | grep -q '4 NVSwitch'"
                    " && break; sleep 1; done; journalctl -u nvidia-fabricmanager -o cat -n 1").stdout
    assert "(4 NVSwitch)" in back and sh(host, "systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
    # The A10G host saw none of it.
    assert version("gpu-a10g", "nvlsm") is None


def test_open_kernel_modules_replace_the_proprietary_ones_at_the_same_version():
    """nvidia_gpu_kernel_modules: open on a host whose driver version is already right and loaded: the open modules'
    package replaces the proprietary one (they conflict), held like the rest, and the new module needs a reboot."""
    host, current = "gpu-a10g", "550.127.08"  # as the driver change test left it, once "rebooted"
    sh(host, f"echo {current} > /sys/module/nvidia/version")
    out = playbook(CONVERGE, "--limit", host, "-e", f"nvidia_gpu_driver_version={current}",
                   "-e", "nvidia_gpu_kernel_modules=open")
    assert out.returncode == 0, out.stdout[-3000:]
    assert version(host, "nvidia-kernel-open-dkms") == f"{current}-1" and version(host, "nvidia-kernel-dkms") is None
    assert "nvidia-kernel-open-dkms" in sh(host, "apt-mark showhold").stdout.split()
    assert version(host, "nvidia-smi") == f"{current}-1"  # the driver's version did not move
    assert sh(host, f"cat {PENDING}").stdout == f"installed={current}\nloaded={current}\n"
