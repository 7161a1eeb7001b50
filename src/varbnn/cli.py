"""The ``varbnn`` command: ``varbnn demo``, ``varbnn reproduce NAME``, ``varbnn render NAME.json``, ``varbnn list``.

Every command runs the experiments, which are not part of the varbnn package: they are the lab, ``varbnn_lab``
(``lab/`` of a clone; ``pip install -e lab/``). :func:`main` forwards the command line to the lab's
(``varbnn_lab.cli.main``, the same options and exit statuses) when the lab is importable, else exits with status 2 and
a message that says how to install it. ``python -m varbnn.cli ...`` (e.g. under ``torchrun``) forwards the same way.
This module is the only one of varbnn that imports the lab, and only when the command runs: ``import varbnn.cli``
imports nothing of it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

__all__ = ["main", "max_threads", "DEVICE_CHOICES", "COMMANDS", "LAB_MISSING"]

DEVICE_CHOICES = "cpu, cuda, cuda:N (N < the number of GPUs), mps, or auto (cuda if available, else cpu)"
"""The values ``--device`` accepts (a device that this machine lacks is refused before anything runs)."""

COMMANDS = {
    "demo": "plain MLP vs mean-field BNN on the bundled digits set (offline, < 3 min)",
    "reproduce": "run a named experiment config and write NAME.json / NAME.md",
    "render": "rewrite NAME.md from a saved NAME.json of `varbnn reproduce NAME`, any NAME (layout only)",
    "list": "list the experiment names",
}
"""The commands of ``varbnn`` (all of them the lab's) and their one-line help."""

LAB_MISSING = "the experiments are not part of the varbnn package: from a clone, `pip install -e lab/`"
"""What ``varbnn COMMAND`` says (exit status 2) where the lab, ``varbnn_lab``, is not installed."""


def max_threads() -> int:
    """The largest ``--threads``: 4 x ``os.cpu_count()``. More threads than that only contend for the cores (10,000 hung
    torch and 100,000 crashed it)."""
    return 4 * (os.cpu_count() or 1)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``varbnn`` command (``list``, ``demo``, ``reproduce``, ``render``): the lab's command line
    (``varbnn_lab.cli.main``) on ``argv`` (default ``sys.argv``), whose exit status it returns (0 on success, 1 when
    runs of the experiment failed, 2 for a usage error). Without the lab: ``--help`` lists the commands, and each
    command prints ``varbnn COMMAND: error:`` and :data:`LAB_MISSING` to stderr and returns 2."""
    try:
        from varbnn_lab.cli import main as lab_main
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "varbnn_lab":
            raise  # the lab is there but something it imports is not: that error is the one to see
        return _without_lab(argv)
    return lab_main(argv)


def _without_lab(argv: Sequence[str] | None) -> int:
    """The commands' names and help without the lab; running one is refused with :data:`LAB_MISSING`."""
    parser = argparse.ArgumentParser(prog="varbnn", description="Variational Bayesian neural networks for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, description=f"{text}. {LAB_MISSING}.", add_help=True)
    args, _ = parser.parse_known_args(argv)
    print(f"varbnn {args.command}: error: {LAB_MISSING}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
