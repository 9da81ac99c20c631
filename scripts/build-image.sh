#!/usr/bin/env bash
# Builds the Debian 12 image with systemd as PID 1 that the local test fleet runs on.
# No container registry is reachable, so the root filesystem comes from debootstrap and `docker import`.
# The image carries a label with the hash of this recipe and is rebuilt only when the recipe changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

# What a freshly installed bare-metal Debian server has: systemd, Python for Ansible, basic tools.
# Everything vLLM needs beyond that (python3-venv, libnuma1, ...) is installed by the roles, as on a real host.
packages=systemd,systemd-sysv,python3,python3-apt,dbus,iproute2,procps,ca-certificates,curl
recipe=$( (cat "$0"; echo "$packages") | sha256sum | cut -c1-16)

have=$(docker image inspect -f '{{ index .Config.Labels "vllm-fleet.recipe" }}' "$VLLM_FLEET_IMAGE" 2>/dev/null || true)
if [ "$have" = "$recipe" ]; then
  log "image $VLLM_FLEET_IMAGE is current (recipe $recipe)"
  exit 0
fi

rootfs=$(mktemp -d "${TMPDIR:-/tmp}/vllm-fleet-rootfs.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
log "debootstrap bookworm into $rootfs (about a minute)"
debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
# Start a container like a booted server: no getty on a console nobody reads, no first-boot wizard.
rm -f "$rootfs"/etc/systemd/system/getty.target.wants/* "$rootfs"/etc/machine-id
touch "$rootfs"/etc/machine-id
chroot "$rootfs" systemctl mask systemd-firstboot.service getty@.service systemd-logind.service >/dev/null 2>&1 || true
# Keep apt lists as an installed server has them: emptied lists look fresh to `cache_valid_time`.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb
log "importing as $VLLM_FLEET_IMAGE"
tar -C "$rootfs" -c . | docker import \
  -c 'CMD ["/lib/systemd/systemd"]' \
  -c "LABEL vllm-fleet.recipe=$recipe" - "$VLLM_FLEET_IMAGE" >/dev/null
log "image $VLLM_FLEET_IMAGE built (recipe $recipe)"
