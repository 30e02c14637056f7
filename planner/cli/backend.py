"""The options that choose where a command's points run: ``--backend``, ``--ray-address``, ``--jobs`` (local) and
``--resume``; shared by ``sweep``, ``report``, ``bench``, ``paper`` and ``solutions`` (see planner/backends/)."""

from __future__ import annotations

from pathlib import Path

import click

from planner.backends import BACKENDS, BackendSpec, Checkpoint
from planner.backends.ray import require_ray
from planner.errors import InputError


def backend_options(resume: bool = True):
    """``--backend``, ``--ray-address`` and (when the command keeps a checkpoint) ``--resume``."""
    opts = [
        click.option("--backend", "backend_name", type=click.Choice(BACKENDS), default="local", show_default=True,
                     help="Where points run: local processes (--jobs), or tasks on a Ray cluster (needs "
                          "pip install 'ho-plan[ray]'). The results are the same."),
        click.option("--ray-address", metavar="ADDRESS",
                     help="The Ray cluster: auto (the one `ray start` made here), HOST:6379, or ray://HOST:10001 "
                          "(default: join the local cluster, or start one)."),
    ]
    if resume:
        opts.append(click.option("--resume", is_flag=True,
                                 help="Skip the points an earlier, interrupted run of the same output already "
                                      "computed (its *.points.jsonl checkpoint)."))

    def deco(f):
        for o in reversed(opts):
            f = o(f)
        return f

    return deco


def backend_spec(name: str, jobs: int, address: str | None, checkpoint: str | Path | None = None,
                 resume: bool = False) -> BackendSpec:
    """The backend a command line asked for; its checkpoint at ``checkpoint`` (read back when ``resume``)."""
    if address and name != "ray":
        raise InputError("command line", "--ray-address", "is for --backend ray")
    if name == "ray":
        require_ray()  # one line now, not after the first grid's set-up
    return BackendSpec(name, jobs, address, Checkpoint(checkpoint, resume) if checkpoint is not None else None)
