#!/usr/bin/env bash
# Downloads the pinned CPU build of vLLM and all its dependencies into an offline wheelhouse, once.
# Test hosts install from it exactly as an air-gapped GPU host installs from its own wheelhouse.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

if [ -f "$VLLM_FLEET_WHEELHOUSE/.complete" ]; then
  log "wheelhouse $VLLM_FLEET_WHEELHOUSE is complete ($(find "$VLLM_FLEET_WHEELHOUSE" -name '*.whl' | wc -l) wheels)"
  exit 0
fi
tmp="$VLLM_FLEET_WHEELHOUSE.partial"
rm -rf "$tmp"; mkdir -p "$tmp"
log "downloading $VLLM_TEST_PACKAGE==$VLLM_TEST_VERSION and its dependencies (about 0.9 GB)"
# Test hosts run Debian 12 (CPython 3.11, x86_64). Cross-platform `pip download --platform` fails to resolve some
# of vLLM's wheels, so the download runs on a matching interpreter instead.
python3 -c 'import sys, platform; sys.exit(sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64")' \
  || die "the wheelhouse must be built with CPython 3.11 on x86_64 (what Debian 12 test hosts run)"
python3 -m pip download --quiet --dest "$tmp" "$VLLM_TEST_PACKAGE==$VLLM_TEST_VERSION"
touch "$tmp/.complete"
rm -rf "$VLLM_FLEET_WHEELHOUSE"; mv "$tmp" "$VLLM_FLEET_WHEELHOUSE"
log "wheelhouse ready: $VLLM_FLEET_WHEELHOUSE ($(du -sh "$VLLM_FLEET_WHEELHOUSE" | cut -f1))"
