"""Failures become exits here, for every command: which error ends it with which status of vit.exits's table,
and with which one line. ``line_and_status`` reads an error; ``exit_on_failure`` is the one wrapper a
command's ``main`` runs in (vit-train reads its failures with ``line_and_status`` itself: every process of a
multi-process run has its part in saying them).

The project's own error types (vit.exits) carry their status, their message is the line. A training also
meets errors that are no bug and that other code raises: a bad value refused by jsonargparse or Lightning
(2), a full disk or an exceeded quota (6), the accelerator's memory running out (7), the processes of a run
losing each other (5); each is read here as one of those types. Anything else — a bug of ours, of a user's
callback or of a dataset, whatever its type — is no failure of this module's: it keeps its traceback (exit 1).
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vit import exits
from vit.training.memory import out_of_memory_message
from vit.cluster.storage import storage_full, storage_message


@dataclass(frozen=True)
class Training:
    """What a training's lines name: its command line (less the mode), its run folder (None before one is
    chosen) and its data module (None before one is made)."""

    argv: list[str]
    run: Path | None = None
    datamodule: Any = None


def line_and_status(error: BaseException, training: Training | None = None) -> tuple[str, int] | None:
    """The one line (without its ``error:`` / ``stopped:``, see ``said``) and the exit status of ``error``, or
    None for a bug, which keeps its traceback. ``training``: the command trains (vit-train), and the errors
    other code raises while it does are read too."""
    known = as_project_error(error, training) if training is not None else error
    status = None if known is None else exits.status_of(known)
    if status is None:
        return None
    return condense(str(known)) if isinstance(known, exits.BadInput) else str(known), status


def as_project_error(error: BaseException, training: Training) -> BaseException | None:
    """``error`` as one of the project's types: itself when it is one; a bad value that jsonargparse or
    Lightning refused, a full disk or quota, the accelerator's memory, lost processes as the type of their
    status, with their one line; None for anything else (a bug)."""
    import torch
    from jsonargparse import ArgumentError
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    if exits.status_of(error) is not None:
        return error
    if isinstance(error, (ArgumentError, MisconfigurationException)):  # jsonargparse's, Lightning's
        return exits.ConfigError(str(error))
    if isinstance(error, OSError) and storage_full(error):
        return exits.StorageFull(storage_message(error, training.run, training.argv))
    if isinstance(error, torch.OutOfMemoryError):
        return exits.OutOfDeviceMemory(out_of_memory_message(error, training.datamodule))
    if isinstance(error, RuntimeError) and lost_contact(error):
        from lightning.pytorch.utilities import rank_zero_only

        rank = rank_zero_only.rank  # every process says it: the one that failed may not be rank 0
        return exits.LostProcesses(
            f"process {rank}: lost the other processes of this run ({first_line(error)}). One of them died (see "
            f"its own error above) or they issued different collectives; the run stopped instead of waiting. "
            f"Resume with --ckpt_path last; allow slower collectives with --ddp_timeout.")
    return None  # a bug, or a failure we do not know: exit 1 with its traceback


def said(line: str, status: int) -> str:
    """The line as a command prints it on stderr: ``stopped:`` where the run stops where it resumes (exit 4),
    ``error:`` otherwise."""
    return f"{'stopped' if status == exits.status_of(exits.Stopped()) else 'error'}: {line}"


def exit_on_failure(main: Callable[..., int]) -> Callable[..., int]:
    """The one wrapper a command's ``main`` runs in: a failure ``line_and_status`` knows prints its line on
    stderr and becomes the command's exit status; anything else (a bug) goes on, with its traceback."""

    @functools.wraps(main)
    def command(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except Exception as error:  # read, not handled: what line_and_status does not know is raised again
            known = line_and_status(error)
            if known is None:
                raise
            print(said(*known), file=sys.stderr)
            return known[1]

    return command


def condense(message: str) -> str:
    """jsonargparse explains a bad value of a subclass-typed field as every alternative it tried;
    keep the reasons that are not about the alternatives, on one line."""
    lines = [line.strip().removeprefix("- ") for line in message.splitlines()]
    reasons = [line for line in lines if line and not line.startswith(("Expected a <class 'NoneType'>", "Given value",
                                                                        "Subtypes:", "Errors:", "Does not validate"))]
    line = " ".join(r if r.endswith(":") or i == len(reasons) - 1 else r + ";" for i, r in enumerate(reasons)) \
        or " ".join(message.split())
    return re.sub(r'Parser key "(\w+)": Problem with given class_path \'[\w.]+\': Parser key "(\w+)"',
                  r'Parser key "\1.\2"', line)


def first_line(e: BaseException) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


GLOO_ERROR = re.compile(r"\[[^\]\s]*\bgloo/[^\]\s]+:\d+\] ")  # gloo's errors start with their source line


def lost_contact(e: RuntimeError) -> bool:
    """A rendezvous or collective that timed out, or whose peer went away: torch's DistError (its stores',
    NCCL's and its sockets' errors), or gloo's own error, which torch 2.14 raises as a plain RuntimeError
    whose text starts with the place in gloo's source that raised it ("[.../gloo/transport/tcp/pair.cc:561]
    Connection closed by peer ...", "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting ...").
    Any other RuntimeError, whatever its words, is a bug: exit 1 with its traceback."""
    import torch.distributed as dist

    return isinstance(e, dist.DistError) or GLOO_ERROR.match(str(e)) is not None
