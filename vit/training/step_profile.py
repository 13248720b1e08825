"""Where a training step's launches and host syncs come from, counted with torch.profiler.

A small model's step on a GPU is bound by kernel launches and by the host waiting for the device, not by its
maths. Both can be counted on any machine, a CPU included: every aten op that runs outside a compiled graph
is about one kernel launch on a GPU (a compiled graph's kernels are launched by its own code, and are
counted once, as the graph), and every ``aten::_local_scalar_dense`` is a ``.item()``, ``bool(tensor)`` or
``float(tensor)``: a host sync when the tensor is on the GPU.

``StepProfile`` is the callback that profiles steady training steps of a real run
(``--trainer.callbacks+ vit.training.step_profile.StepProfile``) and writes what it counted as JSON; ``count`` reads
a profile's events.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

SYNC = "aten::_local_scalar_dense"
# the profiler's names of the collectives a process issues: the dispatcher's c10d ops (c10d::allreduce_, the
# gradients' all-reduce included; c10d::broadcast_, ...), whatever the backend (gloo, NCCL)
COLLECTIVE = "c10d::"


def collective(name: str) -> bool:
    return name.startswith(COLLECTIVE)
# the profiler's names for a compiled graph's forward and backward (torch.compile's region; AOTAutograd's
# autograd function, whose backward the autograd engine runs as "autograd::engine::evaluate_function:
# CompiledFunctionBackward"): an op inside one of them is the graph's own
COMPILED = ("Torch-Compiled Region", "CompiledFunction")


def _compiled(name: str) -> bool:
    return any(part in name for part in COMPILED)


# ops that only make a tensor's metadata (a view, an alias, an allocation) and launch no kernel on a GPU
NO_KERNEL = {"aten::" + name for name in (
    "detach", "detach_", "alias", "view", "_unsafe_view", "reshape", "as_strided", "select", "slice", "t", "mT",
    "transpose", "permute", "unsqueeze", "squeeze", "unbind", "split", "split_with_sizes", "chunk", "expand",
    "narrow", "view_as", "expand_as", "empty", "empty_like", "empty_strided", "resize_", "lift_fresh",
    "_reshape_alias", "contiguous", "to", "_to_copy", "set_", "result_type", "is_nonzero", "size", "stride")}


def _launches(event) -> bool:
    """Whether an op launches a kernel on a GPU: it, or an op it calls, does more than make metadata (an
    ``aten::to`` to the tensor's own device and dtype calls nothing, one that copies calls ``copy_``)."""
    children = [c for c in event.cpu_children if c.name.startswith("aten::")]
    return event.name not in NO_KERNEL or any(_launches(c) for c in children)


def count(events, steps: int) -> dict:
    """Per step, over ``steps`` steps: the aten ops outside compiled graphs (top-level ones: an op that another
    aten op calls is part of that op's launch) and those of them that launch a kernel on a GPU (``NO_KERNEL``:
    the others), the host syncs, the commonest ops of both kinds, and the collectives by name (under DDP)."""
    outside, launching, syncs, collectives, compiles = Counter(), Counter(), Counter(), Counter(), 0
    for event in events:
        name = event.name
        compiles += name == "OutputGraph.call_user_compiler (dynamo_timed)"  # torch.compile compiling a graph
        if collective(name):
            collectives[name] += 1
        if not name.startswith("aten::"):
            continue
        parent, top, compiled = event.cpu_parent, True, False
        while parent is not None:
            top = top and not parent.name.startswith("aten::")
            compiled = compiled or _compiled(parent.name)
            parent = parent.cpu_parent
        if name == SYNC:
            syncs[_caller(event)] += 1
        if top and not compiled:
            outside[name] += 1
            launching[name] += _launches(event)
    return {
        "steps": steps,
        "ops_outside_compiled_per_step": sum(outside.values()) / steps,
        "launching_ops_outside_compiled_per_step": sum(launching.values()) / steps,
        "host_syncs_per_step": sum(syncs.values()) / steps,
        "top_ops_per_step": {name: n / steps for name, n in outside.most_common(25)},
        "top_launching_ops_per_step": {name: n / steps for name, n in launching.most_common(25) if n},
        "host_syncs_by_caller_per_step": {name: n / steps for name, n in syncs.most_common(10)},
        "collectives_per_step": {name: n / steps for name, n in collectives.most_common() if n},
        "compiles": compiles,  # not steady steps when above 0: a compile's ops and syncs are counted too
    }


def _caller(event) -> str:
    """The outermost named range or op around a host sync (what asked for the value)."""
    names, parent = [], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return " < ".join(names[:3]) or "(top level)"


class StepProfile(L.Callback):
    """Profiles ``steps`` training steps from step ``start`` of this process (setup, the first batches and their
    compiles are before them), prints what ``count`` finds and, with ``path``, writes it there as JSON with the
    run's configuration of the step (batch, devices, precision). ``cuda``: the GPU's activities as well
    (kernels, with their time), where there is one. ``stop``: end training after the profile (a run made only to
    be profiled: its checkpoints and test follow as at any other end)."""

    def __init__(self, start: int = 10, steps: int = 10, path: str | None = None, cuda: bool = True,
                 stop: bool = False):
        if start < 1 or steps < 1:
            from vit.exits import ConfigError

            raise ConfigError(f"StepProfile needs start ≥ 1 and steps ≥ 1, got start={start}, steps={steps}")
        self.start, self.steps, self.path, self.cuda, self.stop = start, steps, path, cuda, stop
        self.profiler = None
        self.result: dict | None = None

    def _activities(self, pl_module) -> list:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda and pl_module.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return activities

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.start and self.profiler is None and self.result is None:
            self.profiler = torch.profiler.profile(activities=self._activities(pl_module))
            self.profiler.__enter__()
            self.first = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.profiler is None or trainer.global_step < self.first + self.steps:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.profiler.__exit__(None, None, None)
        steps = trainer.global_step - self.first
        self.result = {**count(self.profiler.events(), steps), "from_step": self.first,
                       "batch_size": trainer.datamodule.process_batch(), "device": str(pl_module.device),
                       "precision": str(trainer.precision), "compiled": bool(pl_module.hparams.get("compile")),
                       "threads": torch.get_num_threads()}
        if pl_module.device.type == "cuda":
            self.result["cuda_kernels_per_step"] = _kernels(self.profiler.events()) / steps
        self.profiler = None
        if self.result["compiles"]:
            rank_zero_info(f"step profile: torch.compile compiled during steps {self.first}–{trainer.global_step - 1} "
                           "(a first batch, or a new image size): its counts are not those of steady steps; "
                           "choose other steps with --trainer.callbacks.start")
        rank_zero_info(f"step profile (steps {self.first}–{trainer.global_step - 1}): "
                       f"{self.result['ops_outside_compiled_per_step']:.0f} ops outside compiled graphs "
                       f"({self.result['launching_ops_outside_compiled_per_step']:.0f} of them launch a kernel) and "
                       f"{self.result['host_syncs_per_step']:.1f} host syncs per step")
        trainer.should_stop = trainer.should_stop or self.stop
        if self.path and trainer.is_global_zero:  # a record: the command, commit, machine and versions first
            import sys

            from vit.training.results import keep_diff, provenance

            record = {**provenance(sys.argv[1:], "train", pl_module.device.type, trainer.world_size), **self.result}
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            keep_diff(Path(self.path), record)
            Path(self.path).write_text(json.dumps(record, indent=1) + "\n")

    def on_train_end(self, trainer, pl_module):
        if self.profiler is not None:  # the run ended inside the window: what it profiled is not counted
            self.profiler.__exit__(None, None, None)
            self.profiler = None


def _kernels(events) -> int:
    return sum(1 for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
