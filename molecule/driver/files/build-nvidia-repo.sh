#!/bin/bash
# Builds a small signed apt repository laid out and named like NVIDIA's CUDA repository for Debian 12, for the
# driver scenario's hosts (they have no GPU): build-nvidia-repo.sh OUT_DIR REPO_URL STANDINS_DIR
#   OUT_DIR/compute/cuda/repos/debian12/<arch>/  *.deb, Packages(.gz), Release, InRelease, Release.gpg
# The packages carry NVIDIA's names and dependencies as the role meets them: cuda-keyring (key + apt source),
# cuda-drivers-<branch>, nvidia-driver, nvidia-smi, nvidia-kernel-dkms, nvidia-kernel-open-dkms,
# nvidia-persistenced, nvidia-fabricmanager-<branch>, datacenter-gpu-manager, nvlsm. No kernel module and no library
# is inside: nvidia-smi, nvidia-persistenced, nv-fabricmanager, nv-hostengine and nvlsm are the stand-ins of
# STANDINS_DIR, which behave by what the host's sysfs shows (/sys/module/nvidia/version, /sys/module/ib_umad,
# NVSwitch or the NVLink 5 CX7 bridge on /sys/bus/pci/devices).
set -euo pipefail
out=$1 url=$2 standins=$3
arch_deb=$(dpkg --print-architecture)
arch_dir=$(uname -m | sed 's/aarch64/sbsa/')
repo=$out/compute/cuda/repos/debian12/$arch_dir
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out" && mkdir -p "$repo"

# The repository's signing key, made for this run only.
export GNUPGHOME=$work/gnupg
mkdir -m 700 "$GNUPGHOME"
gpg --batch --quiet --passphrase '' --quick-gen-key 'vllm-fleet driver scenario <cudatools@invalid>' ed25519 sign never
gpg --batch --export > "$work/cuda-archive-keyring.gpg"

# [conflicts=NAMES] package NAME VERSION ARCH DEPENDS [SRC:DEST ...]
package() {
  local name=$1 version=$2 arch=$3 depends=$4 dir
  shift 4
  dir=$work/pkg/${name}_$version
  mkdir -p "$dir/DEBIAN"
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: vllm-fleet tests <cudatools@invalid>"
    [ -n "$depends" ] && echo "Depends: $depends"
    [ -n "${conflicts:-}" ] && echo "Conflicts: $conflicts"
    echo "Section: non-free/libs"
    echo "Priority: optional"
    echo "Description: $name stand-in for the driver scenario (no GPU here)"
  } > "$dir/DEBIAN/control"
  local item src dest
  for item in "$@"; do
    src=${item%%:*} dest=${item#*:}
    install -D -m "$( [[ $dest == */bin/* || $dest == */sbin/* ]] && echo 0755 || echo 0644 )" "$src" "$dir$dest"
  done
  dpkg-deb --root-owner-group --build "$dir" "$repo/${name}_${version}_$arch.deb" > /dev/null
}

# cuda-keyring 1.1-1: the key and an apt source that names it, as NVIDIA's package installs them.
echo "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] $url/debian12/$arch_dir/ /" > "$work/cuda.list"
package cuda-keyring 1.1-1 all "" \
  "$work/cuda-archive-keyring.gpg:/usr/share/keyrings/cuda-archive-keyring.gpg" \
  "$work/cuda.list:/etc/apt/sources.list.d/cuda-debian12-$arch_dir.list"

# Two versions of branch 550 and a newer branch: without the role's pin, cuda-drivers-550's ">=" dependencies
# would pull 560's packages in.
for version in 550.127.08 550.144.03 560.35.03; do
  branch=${version%%.*}
  # The binaries know their version, as the real ones are built for theirs.
  sed "s/^LIBRARY_VERSION = None$/LIBRARY_VERSION = \"$version\"/" "$standins/nvidia-smi" > "$work/nvidia-smi"
  for tool in nvidia-persistenced nv-fabricmanager nv-hostengine; do
    sed "s/@VERSION@/$version/" "$standins/$tool" > "$work/$tool"
  done
  package "cuda-drivers-$branch" "$version-1" "$arch_deb" \
    "nvidia-driver (>= $version), nvidia-smi (>= $version), nvidia-kernel-dkms (>= $version) | nvidia-kernel-open-dkms (>= $version), nvidia-persistenced (>= $version)"
  package nvidia-driver "$version-1" "$arch_deb" "nvidia-kernel-dkms (= $version-1) | nvidia-kernel-open-dkms (= $version-1)"
  package nvidia-smi "$version-1" "$arch_deb" "python3" "$work/nvidia-smi:/usr/bin/nvidia-smi"
  package nvidia-kernel-dkms "$version-1" "$arch_deb" ""
  # Both build the one "nvidia" kernel module: a host has one flavour or the other.
  conflicts=nvidia-kernel-dkms package nvidia-kernel-open-dkms "$version-1" "$arch_deb" ""
  package nvidia-persistenced "$version-1" "$arch_deb" "" \
    "$work/nvidia-persistenced:/usr/bin/nvidia-persistenced" \
    "$standins/nvidia-persistenced.service:/lib/systemd/system/nvidia-persistenced.service"
  package "nvidia-fabricmanager-$branch" "$version-1" "$arch_deb" "" \
    "$work/nv-fabricmanager:/usr/bin/nv-fabricmanager" \
    "$standins/nvidia-fabricmanager.service:/lib/systemd/system/nvidia-fabricmanager.service"
done
# NVLink Subnet Manager, for NVLink 5 boards (HGX B200 and later): dated versions of its own, not the driver's.
nvlsm_version=2025.06.5
sed "s/@VERSION@/$nvlsm_version/" "$standins/nvlsm" > "$work/nvlsm"
printf 'log_file /var/log/nvlsm.log\n' > "$work/nvlsm.conf"
package nvlsm "$nvlsm_version-1" "$arch_deb" "" \
  "$work/nvlsm:/opt/nvidia/nvlsm/sbin/nvlsm" "$work/nvlsm.conf:/usr/share/nvidia/nvlsm/nvlsm.conf"
package datacenter-gpu-manager 1:3.3.9 "$arch_deb" "" \
  "$work/nv-hostengine:/usr/bin/nv-hostengine" "$standins/nvidia-dcgm.service:/lib/systemd/system/nvidia-dcgm.service"

# A flat repository ("deb URL /"), signed as NVIDIA's: InRelease and Release.gpg.
cd "$repo"
apt-ftparchive packages . > Packages
gzip -9k Packages
apt-ftparchive -o APT::FTPArchive::Release::Origin=NVIDIA -o APT::FTPArchive::Release::Label="NVIDIA CUDA" \
  -o APT::FTPArchive::Release::Architectures="$arch_deb" release . > Release
gpg --batch --yes --clearsign -o InRelease Release
gpg --batch --yes -abs -o Release.gpg Release
# The key's fingerprint, for the test to compare with what the hosts trust.
gpg --batch --with-colons --fingerprint | awk -F: '/^fpr/ {print $10; exit}' > "$out/fingerprint"
