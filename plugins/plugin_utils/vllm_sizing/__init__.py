# Copyright: contributors to vllm-fleet
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_sizing filters' implementation, one concern per module (the filters are filter_plugins/vllm_sizing.py):

- shape: the model from config.json; weights: its tensors and their bytes per GPU;
- versions: what changes between vLLM releases; kv: the KV arithmetic on top of both;
- budget: memory per GPU before the KV cache; plan: vllm_sizing's fallbacks and messages;
- flags: the command line.
"""
