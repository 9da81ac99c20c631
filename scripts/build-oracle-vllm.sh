#!/usr/bin/env bash
# The oracle's second CPU release of vLLM (scripts/lib.sh VLLM_ORACLE_VERSION) on the controller: its wheelhouse and
# its venv, built the way the fleet's release is (build-wheelhouse.sh, build-controller-vllm.sh), once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
export VLLM_TEST_VERSION=$VLLM_ORACLE_VERSION
unset VLLM_FLEET_WHEELHOUSE
bash "$here/build-wheelhouse.sh"
bash "$here/build-controller-vllm.sh"
