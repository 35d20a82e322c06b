"""The ``pagedserve`` command: one entry point, subcommands imported only when chosen."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

# Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``.
# Modules are named as strings so that `pagedserve bench` never imports torch.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("pagedserve.cli.generate", "generate text offline with the engine"),
    "serve": ("pagedserve.cli.serve", "run the OpenAI-compatible HTTP server"),
    "batch": ("pagedserve.client.cli", "run a JSONL batch against a server under a token budget"),
    "bench": ("pagedserve.loadgen.cli", "measure an OpenAI-compatible server"),
    "router": ("pagedserve.router.cli", "route requests across replicas by prefix and load"),
}


def _version() -> str:
    try:
        return importlib.metadata.version("pagedserve")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "0.0.0"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = SUBCOMMANDS  # named, not looked up: finding a module imports its package
    parser = argparse.ArgumentParser(prog="pagedserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pagedserve {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in commands.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] not in commands:
        parser.parse_args(argv)  # prints usage / errors for unknown commands
        parser.print_help()
        return 2
    module = importlib.import_module(commands[argv[0]][0])
    command_parser = argparse.ArgumentParser(prog=f"pagedserve {argv[0]}")
    module.add_arguments(command_parser)
    args = command_parser.parse_args(argv[1:])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
