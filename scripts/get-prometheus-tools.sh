#!/usr/bin/env bash
# promtool and amtool for `make check` (rule unit tests, config checks), from the Debian packages the monitoring
# role installs, unpacked into the cache: nothing is installed and no Prometheus runs on this machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

dest=$VLLM_FLEET_PROMETHEUS_TOOLS
if [ -x "$dest/usr/bin/promtool" ] && [ -x "$dest/usr/bin/amtool" ]; then
  log "prometheus tools: $("$dest/usr/bin/promtool" --version 2>&1 | head -1)"
  exit 0
fi
command -v apt-get >/dev/null || die "apt-get is needed to download Debian's prometheus packages"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# apt downloads as its unprivileged _apt user when that user can write the directory.
if id _apt >/dev/null 2>&1; then chown _apt "$tmp"; fi
cd "$tmp"
log "downloading Debian's prometheus and prometheus-alertmanager packages (about 30 MB)"
apt-get download -q prometheus prometheus-alertmanager >/dev/null 2>&1 \
  || { apt-get update -qq; apt-get download -q prometheus prometheus-alertmanager >/dev/null; }
rm -rf "$dest.partial"; mkdir -p "$dest.partial"
for deb in ./*.deb; do dpkg-deb -x "$deb" "$dest.partial"; done
"$dest.partial/usr/bin/promtool" --version >/dev/null
"$dest.partial/usr/bin/amtool" --version >/dev/null
rm -rf "$dest"; mv "$dest.partial" "$dest"
log "prometheus tools ready: $("$dest/usr/bin/promtool" --version 2>&1 | head -1)"
