"""`vit-train` / `python scripts/train.py`: train a ViT (LightningCLI), then test the best checkpoint.

    vit-train [fit] [--config RECIPE ...] [--section.field VALUE ...]   train (the default)
    vit-train test --ckpt_path CKPT [--data... ]                          evaluate a checkpoint

A recipe is a name (see --help for the list) or a YAML path; recipes are deltas over the default one.
Exit statuses: vit.exits (shown by --help).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Optional

import lightning as L
from jsonargparse import ActionConfigFile, ArgumentError, DefaultHelpFormatter
from jsonargparse.typing import PositiveFloat, PositiveInt
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
from lightning.pytorch.plugins.environments import LightningEnvironment, SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from vit import configs, environment, exits, launch, loggers, results, runs
from vit.callbacks import LogConfig, TimeToAccuracy
from vit.guards import StopAfterMinutes, StopOnNonFinite, StopOnSignal
from vit.progress import ModelSummary, ProgressBar
from vit.resume import RNGStates, StepCheckpoint
from vit.seeding import EpochSeed
from vit.checkpoint_io import AtomicCheckpointIO
from vit.checkpoints import read_checkpoint
from vit.exits import CheckpointError, ConfigError, Stopped
from vit.loggers import quiet_lightning
from vit.module import ViTClassifier

MODES = ("fit", "test")

def quiet_third_party() -> None:
    """Third-party noise every run printed, filtered narrowly (message and module); set by the command when it
    runs, never by an import."""
    warnings.filterwarnings("ignore", message=r".*`isinstance\(treespec, LeafSpec\)` is deprecated", module="lightning")
    warnings.filterwarnings("ignore", message=r".*pkg_resources is deprecated", category=UserWarning)
    warnings.filterwarnings("ignore", message=r".*when using `ckpt_path`, callbacks used to create the checkpoint")
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty", module="lightning")  # a resume
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")  # a login node
    warnings.filterwarnings("ignore", message=r"Encountered `nan` values in tensor", module="torchmetrics")  # exit 3 says it
    # vit.resume restores the train loader's position itself (Lightning restores stateful loaders too late for us)
    warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")
    quiet_lightning()


class HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help, with the exit table's lines kept as written."""


class RecipeFile(ActionConfigFile):
    """--config NAME|PATH: a recipe of vit.configs by name, or any YAML file."""

    def __call__(self, parser, cfg, values, option_string=None):
        super().__call__(parser, cfg, str(configs.path(values)), option_string)


class ViTCLI(LightningCLI):
    def __init__(self, mode: str, argv: list[str], claimed: list[Path]):
        self.mode, self.argv, self.claimed, self.resume = mode, argv, claimed, None
        defaults = [configs.path(configs.BASE), configs.path(configs.DEFAULT)]
        if mode == "fit" and not configs.named_recipes(argv) and not configs.gpu_present():
            environment.check_gpus_usable()  # GPUs given but unusable: never the CPU recipe in their place
            defaults.append(configs.path(configs.CPU))
            rank_zero_info(f"no GPU here: the default recipe {configs.DEFAULT} is a GPU recipe (100 epochs, bf16), so "
                           f"this runs the {configs.CPU} recipe (10 minutes); name a recipe with --config to choose")
        if {"-h", "--help"} & set(argv):  # --help shows the defaults of the recipes named on the line
            defaults += [configs.path(name) for name in configs.named_recipes(argv)]
        super().__init__(ViTClassifier, L.LightningDataModule, subclass_mode_data=True, run=False, args=argv,
                         save_config_callback=LogConfig, save_config_kwargs={"overwrite": True},
                         auto_configure_optimizers=False,
                         parser_kwargs={"exit_on_error": False, "prog": "vit-train", "epilog": exits.text(),
                                        "formatter_class": HelpFormatter,
                                        "description": __doc__.split("\n\n")[0],
                                        "default_config_files": [str(p) for p in defaults]})

    def init_parser(self, **kwargs):
        parser = self.parser_class(**kwargs)
        parser.add_argument("-c", "--config", action=RecipeFile,
                            help=f"a recipe ({', '.join(configs.names())}) or a YAML file; applied over the "
                                 f"default recipe {configs.DEFAULT} in order")
        return parser

    def add_arguments_to_parser(self, parser):
        parser.add_argument("--ckpt_path", default=None,
                            help="fit: resume from this checkpoint, or 'last': the newest run's last.ckpt; "
                                 "test: the checkpoint to evaluate")
        parser.add_argument("--run", default=None,
                            help="name the run folder under the root (default: the next version_N); "
                                 "with --ckpt_path last, the run to resume")
        parser.add_argument("--test_after_fit", type=bool, default=True,
                            help="test the best checkpoint on the test set when fit ends")
        parser.add_argument("--ddp_timeout", type=PositiveInt, default=600,
                            help="seconds the processes of a multi-process run may wait for each other (at start "
                                 "and in every collective) before the run ends with exit 5 (a dead or "
                                 "desynchronised process)")
        parser.add_argument("--stop_after_minutes", type=Optional[PositiveFloat], default=None,
                            help="end this command in time for a wall-clock limit on it: at the end of the last "
                                 "epoch that fits (exit 4); --ckpt_path last continues the run exactly")
        parser.add_argument("--step_checkpoint_minutes", type=Optional[PositiveFloat], default=10.0,
                            help="write <run>/checkpoints/step.ckpt every this many minutes of training, mid-epoch "
                                 "(null: never): after a crash, --ckpt_path last resumes from the newer of it and "
                                 "last.ckpt, exactly, losing at most this much")
        parser.link_arguments("model.arch.image_size", "data.init_args.image_size")
        parser.link_arguments("data.num_classes", "model.arch.num_classes", apply_on="instantiate")

    def parse_arguments(self, parser, args):
        self.config = parser.parse_args(args)

    def before_instantiate_classes(self):
        cfg = self.config
        if str(cfg.trainer.accelerator) in ("auto", "gpu", "cuda"):
            environment.check_gpus_usable()
        root = Path(cfg.trainer.default_root_dir or Path("runs") / configs.recipe_name(self.argv))
        if self.mode == "test":
            if not cfg.ckpt_path or cfg.ckpt_path == "last":
                raise ConfigError("test needs --ckpt_path CKPT, the checkpoint file to evaluate")
            ckpt = read_checkpoint(cfg.ckpt_path)
            hparams = {k: v for k, v in ckpt.get("hyper_parameters", {}).items() if not k.startswith("_")}
            self.config = cfg = self.parser.parse_object({"model": hparams}, cfg)  # the checkpoint's model
            run = runs.run_of(Path(cfg.ckpt_path)) or runs.claim_new_version(root)
            self.resume = (Path(cfg.ckpt_path), ckpt)
        else:
            given = read_checkpoint(cfg.ckpt_path) if cfg.ckpt_path not in (None, "last") else None
            if given is not None:
                self.check_resumable(given)
            existed = set(root.iterdir()) if root.is_dir() else set()
            run, ckpt_path, ckpt, note = runs.resolve(root, cfg.ckpt_path, cfg.run)
            if run not in existed:
                self.claimed.append(run)
            if ckpt_path is not None:
                ckpt = ckpt or given or read_checkpoint(ckpt_path)
                self.check_resumable(ckpt)
                self.resume = (ckpt_path, ckpt)
            rank_zero_info(note or f"run folder: {run}")
            launch.apply_allocation(cfg.trainer)
        os.environ[runs.ENV] = str(run)  # the processes Lightning's DDP launcher starts use this folder too
        known = self.resume[1].get("vit", {}).get("wandb_run_id") if self.resume else None
        runs.place_outputs(cfg, run, known)

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        """The Trainer as configured, plus: DDP with the --ddp_timeout on its process group; checkpoints
        written atomically in their own folder (vit.checkpoint_io); under SLURM,
        Lightning's own preemption handler off (it deadlocks DDP: vit.guards.StopOnSignal handles
        SIGUSR1); and the run's own callbacks (run_callbacks)."""
        config = self.config_init.trainer
        devices, nodes = config.get("devices", "auto"), config.get("num_nodes", 1)
        count = devices if isinstance(devices, int) else len(devices) if isinstance(devices, list) else \
            int(devices) if str(devices).isdigit() else 1
        strategy = config.get("strategy", "auto")
        if strategy == "ddp" or (strategy == "auto" and count * nodes > 1):
            from lightning.pytorch.strategies import DDPStrategy

            environment.nccl_errors_reach_python()  # (before the processes and their group are made)
            kwargs["strategy"] = DDPStrategy(timeout=timedelta(seconds=self.config.ddp_timeout))
        plugins = config.get("plugins") or []
        kwargs["plugins"] = [*(plugins if isinstance(plugins, list) else [plugins]), AtomicCheckpointIO(),
                             *([SLURMEnvironment(auto_requeue=False)] if launch.slurm_job() else [])]
        configured = config.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        kwargs["callbacks"] = [*configured, *self.run_callbacks(config, configured)]
        return super().instantiate_trainer(**kwargs)

    def run_callbacks(self, config, configured: list) -> list[L.Callback]:
        """Every run's own callbacks, attached here and nowhere else (a recipe lists only what it chooses:
        checkpoints, throughput, W&B media, time to accuracy): exact resume (epoch seeds), the divergence
        and preemption stops (looked at every log_every_n_steps steps), the run's clock and record, the
        learning rate in the logs, --stop_after_minutes, the rolling step checkpoint and each process's RNG
        states in checkpoints (exact mid-epoch resume, vit.resume), and vit.progress.ProgressBar and ModelSummary
        unless one is configured or turned off."""
        from lightning.pytorch.callbacks import LearningRateMonitor


        every = config.get("log_every_n_steps") or 50
        # StopOnSignal after the clock: its checkpoint of the stop step holds that step's count
        callbacks = [EpochSeed(), RNGStates(), StopOnNonFinite(every), results.TrainingClock(), StopOnSignal(every)]
        if config.get("logger", True) not in (False, []):
            callbacks.append(LearningRateMonitor("step"))
        if config.get("enable_progress_bar") is not False and \
                not any(isinstance(c, LightningProgressBar) for c in configured):
            callbacks.append(ProgressBar())
        if config.get("enable_model_summary") is not False and \
                not any(isinstance(c, LightningModelSummary) for c in configured):
            callbacks.append(ModelSummary())
        if self.config.get("step_checkpoint_minutes"):  # the rolling step checkpoint (vit.runs.STEP)
            callbacks.append(StepCheckpoint(Path(config.get("default_root_dir")) / runs.CHECKPOINTS,
                                            self.config.step_checkpoint_minutes))
        if self.config.get("stop_after_minutes"):
            callbacks.append(StopAfterMinutes(self.config.stop_after_minutes))
        return callbacks

    def check_resumable(self, ckpt: dict) -> None:
        """A checkpoint whose model does not fit the command line: one line naming the differences."""
        theirs = ckpt.get("hyper_parameters", {}).get("arch", {})
        ours = vars(self.config.model.arch)
        diff = [f"{k}: checkpoint {theirs[k]!r}, command line {ours[k]!r}" for k in ours
                if k in theirs and k != "num_classes" and theirs[k] != ours[k]]
        if diff:
            raise CheckpointError(f"{self.config.ckpt_path or 'the last checkpoint'}: its model does not fit "
                                  f"this command line ({'; '.join(diff)})")

    def fit(self) -> None:
        ckpt = str(self.resume[0]) if self.resume else None
        if self.trainer.world_size > 1:
            launch.join_torchrun_group(self.trainer.strategy.root_device.type, self.config.ddp_timeout)
        self.trainer.fit(self.model, datamodule=self.datamodule, ckpt_path=ckpt)
        limit = next((cb for cb in self.trainer.callbacks if isinstance(cb, StopAfterMinutes)), None)
        if limit is not None and limit.stopped_at is not None:
            raise Stopped(f"stopped after epoch {limit.stopped_at}, in time for --stop_after_minutes "
                          f"{self.config.stop_after_minutes:g}: continue the run with --ckpt_path last --run "
                          f"{Path(self.trainer.default_root_dir).name}")
        if self.config.test_after_fit and not self.trainer.interrupted:
            callback = self.trainer.checkpoint_callback
            self.test(callback.best_model_path if callback and callback.best_model_path else None)

    def test(self, ckpt: str | None) -> None:
        """Test ``ckpt`` (None: the weights in memory) on one process, so each test image counts once."""
        import torch

        trainer = self.trainer
        if trainer.world_size > 1:
            if not trainer.is_global_zero:
                return
            torch.distributed.destroy_process_group()
        quiet = logging.getLogger("lightning.pytorch")
        level = quiet.level
        quiet.setLevel(logging.WARNING)  # the device lines and restoring messages, said once already
        tester = L.Trainer(accelerator=trainer.accelerator, devices=1, num_nodes=1, logger=trainer.loggers,
                           precision=trainer.precision_plugin.precision, plugins=[LightningEnvironment()],
                           callbacks=[ProgressBar()] if trainer.progress_bar_callback else [],
                           enable_checkpointing=False, default_root_dir=trainer.default_root_dir,
                           enable_progress_bar=trainer.progress_bar_callback is not None)
        try:
            (metrics,) = tester.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt, verbose=False)
        finally:
            quiet.setLevel(level)
        rank_zero_info(f"test on {len(self.datamodule.test_set)} images with {ckpt or 'the final weights'}: "
                       f"top-1 {100 * metrics['test/acc']:.2f}%, top-5 {100 * metrics['test/acc5']:.2f}%")
        self.record(ckpt, metrics)
        self.report()

    def record(self, ckpt: str | None, metrics: dict) -> None:
        """results.json in the run folder (vit.results), and the same record in the W&B run's summary.
        After fit it describes the run (its clock, steps, epochs); after ``test`` the checkpoint's run."""
        import torch

        run = Path(self.trainer.default_root_dir)
        if self.mode == "fit":
            clock = next(cb for cb in self.trainer.callbacks if isinstance(cb, results.TrainingClock)).state_dict()
            recipe = configs.recipe_name(self.argv)
        else:
            clock = results.TrainingClock.of(self.resume[1])
            recipe = Path(configs.named_recipes(self.argv)[-1]).stem if configs.named_recipes(self.argv) else run.parent.name
        best = self.model.val_acc_best.max_value  # restored with the tested checkpoint's state
        reached = next((cb.reached for cb in self.trainer.callbacks if isinstance(cb, TimeToAccuracy)), None)
        record = results.make(
            recipe=recipe, argv=[self.mode, *self.argv] if self.mode == "test" else self.argv,
            accelerator=self.model.device.type, devices=self.trainer.world_size, metrics=metrics,
            checkpoint=ckpt and os.path.relpath(ckpt, run), best_val_acc=round(100 * best.item(), 2) if torch.isfinite(best) else None,
            epochs=clock.get("epochs"), steps=clock.get("steps"), training_seconds=clock.get("training_seconds"),
            wall_seconds=round(results.wall_seconds(), 1),
            train_images_per_second=clock.get("train_images_per_second"),
            **({"time_to_val_acc": {f"{t:.2f}": round(s, 1) for t, s in reached.items()}} if reached is not None else {}))
        path = results.write(run, record, None if self.mode == "fit" else Path(ckpt).stem)
        rank_zero_info(f"record: {path}")
        wandb = loggers.wandb_logger(self.trainer.loggers)
        if wandb is not None:
            wandb.experiment.summary.update(record)

    def report(self) -> None:
        """The run's figures (vit.report) into its folder, and to W&B when it is on."""
        from vit import report

        run = Path(self.trainer.default_root_dir)
        figures = report.write(run, self.model, self.datamodule.test_set)
        wandb = loggers.wandb_logger(self.trainer.loggers)
        for figure in figures if wandb is not None else []:
            wandb.log_image(key=f"report/{figure.stem}", images=[str(figure)])
        if figures:
            rank_zero_info(f"figures: {', '.join(str(f) for f in figures)}")


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


def lost_contact(e: RuntimeError) -> bool:
    """A rendezvous or collective that timed out, or whose peer went away: torch's DistError, or, once the
    process group exists, gloo's and NCCL's own words for it."""
    import torch.distributed as dist

    if isinstance(e, dist.DistError):
        return True
    text = str(e).lower()
    return dist.is_initialized() and any(w in text for w in ("timed out", "connection closed by peer",
                                                             "connection reset by peer", "broken pipe"))


def main(argv: list[str] | None = None) -> int:
    import torch

    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv.pop(0) if argv and argv[0] in MODES else "fit"
    quiet_third_party()
    claimed: list[Path] = []  # a run folder this process created
    inherited = runs.ENV in os.environ  # set by the process that launched this one (DDP)
    code = 1  # a bug, unless the run ends otherwise below
    results.commit()  # the code that runs, before anyone edits the tree
    cli = None
    try:
        cli = ViTCLI(mode, argv, claimed)
        if mode == "fit":
            cli.fit()
        else:
            cli.test(str(cli.resume[0]))
    except (exits.BadInput, ArgumentError, MisconfigurationException) as e:  # ours, jsonargparse's, Lightning's
        code, message = exits.status_of(exits.BadInput()), condense(str(e))
    except (exits.TrainingDiverged, exits.Stopped) as e:
        code, message = exits.status_of(e), str(e)
    except OSError as e:
        if not environment.storage_full(e):
            raise  # a bug, or a failure we do not know: exit 1 with its traceback
        run = os.environ.get(runs.ENV)
        code, message = exits.status_of(exits.StorageFull()), environment.storage_message(e, run and Path(run), argv)
    except torch.OutOfMemoryError as e:
        code = exits.status_of(exits.OutOfDeviceMemory())
        message = environment.out_of_memory_message(e, cli and cli.datamodule)
    except RuntimeError as e:
        if not lost_contact(e):
            raise  # a bug: exit 1 with its traceback
        rank = rank_zero_only.rank  # every process says it: the one that failed may not be rank 0
        print(f"error: process {rank}: lost the other processes of this run ({first_line(e)}). One of them died "
              f"(see its own error above) or they issued different collectives; the run stopped instead of "
              f"waiting. Resume with --ckpt_path last; allow slower collectives with --ddp_timeout.",
              file=sys.stderr)
        code = exits.status_of(exits.LostProcesses())
        return code
    else:
        code = 0
        return code
    finally:
        if not inherited:
            os.environ.pop(runs.ENV, None)
        loggers.end_wandb_run(code)
    # every process fails alike on a bad input, a divergence or a stop (say it once); a full disk or device
    # memory is one process's own
    alike = code in [exits.status_of(e()) for e in (exits.BadInput, exits.TrainingDiverged, exits.Stopped)]
    if rank_zero_only.rank == 0 or not alike:
        print(f"{'stopped' if code == exits.status_of(exits.Stopped()) else 'error'}: {message}", file=sys.stderr)
    for run in claimed:
        if run.is_dir() and {p.name for p in run.iterdir()} <= {runs.WANDB_ID}:
            shutil.rmtree(run)  # a run that never started leaves no folder behind (its W&B id unused)
    return code
