"""`vit-train` / `python scripts/train.py`: train a ViT (LightningCLI), then test the best checkpoint.

    vit-train [fit] [--config RECIPE ...] [--section.field VALUE ...]   train (the default)
    vit-train test --ckpt_path CKPT [--data... ]                          evaluate a checkpoint

A recipe is a name (see --help) or a YAML path, applied over the default recipe.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Optional

import lightning as L
from jsonargparse import ActionConfigFile, ArgumentError, DefaultHelpFormatter, get_loader, set_loader
from jsonargparse.typing import PositiveFloat, PositiveInt
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.utilities import rank_zero_info

from vit import configs, exits, failures
from vit.cluster import gpus, launch, run_lock, runs
from vit.reporting import report
from vit.training import commits, loggers, results
from vit.training.callbacks import LogConfig, run_callbacks
from vit.training.guards import StopAfterMinutes, Watchdog
from vit.training.progress import ProgressBar
from vit.models.checkpoints import (check_checkpoint, check_classes, check_weights, old_option, plain,
                                    read_checkpoint)
from vit.data.datamodules import split_batch
from vit.exits import CheckpointError, ConfigError, Stopped
from vit.training.loggers import quiet_lightning
from vit.training.module import ViTClassifier
from vit.data.resume import StepEndTimer, check_global_batch, check_validation_interval

MODES = ("fit", "test")

def quiet_third_party() -> None:
    """Filter known third-party warnings narrowly; called when the command runs, never on import."""
    warnings.filterwarnings("ignore", message=r".*`isinstance\(treespec, LeafSpec\)` is deprecated", module="lightning")
    warnings.filterwarnings("ignore", message=r".*pkg_resources is deprecated", category=UserWarning)
    warnings.filterwarnings("ignore", message=r".*when using `ckpt_path`, callbacks used to create the checkpoint")
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty", module="lightning")  # a resume
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")  # a login node
    warnings.filterwarnings("ignore", message=r"Encountered `nan` values in tensor", module="torchmetrics")  # exit 3 says it
    # we restore the train loader's position ourselves (Lightning does it too late)
    warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")
    quiet_lightning()


class HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help, keeping the exit table's line breaks."""


class RecipeFile(ActionConfigFile):
    """--config: a recipe name, a YAML/JSON file, or settings as one JSON mapping (W&B sweeps' ${args_json})."""

    def __call__(self, parser, cfg, values, option_string=None):
        if configs.is_settings(values):
            refuse_old_options(settings_model_options(values), "--config: ")
            super().__call__(parser, cfg, values, option_string)
            return
        path = configs.path(values)
        refuse_old_options(yaml_model_options(path), f"{path}: ")
        super().__call__(parser, cfg, str(path), option_string)


PARSER_MODE = "python_or_yaml"


def read_value(text: str):
    """Parse an option value as YAML, but None and list/tuple/dict Python literals as Python: W&B's sweep agent
    passes str() of each value, so --model.ema_decay=None must mean null."""
    value = ""  # not a Python literal
    if text.strip() == "None" or text.lstrip().startswith(("[", "(", "{")):  # (0,1 stays YAML's string)
        try:
            value = ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    if value is None or isinstance(value, (list, tuple, dict)) and plain(value):
        return as_yaml_types(value)
    return get_loader("yaml")(text)


def as_yaml_types(value):
    """Tuples as lists, as jsonargparse's loaders return them."""
    if isinstance(value, (list, tuple)):
        return [as_yaml_types(v) for v in value]
    if isinstance(value, dict):
        return {k: as_yaml_types(v) for k, v in value.items()}
    return value


def yaml_model_options(path: Path) -> dict:
    import yaml

    try:
        recipe = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}  # jsonargparse says what is wrong with it
    model = recipe.get("model") if isinstance(recipe, dict) else None
    return model if isinstance(model, dict) else {}


def settings_model_options(value: str) -> dict:
    """The model options in --config settings (JSON text or file), as one dict without "model." prefixes."""
    import json

    try:
        settings = json.loads(value if value.lstrip().startswith("{") else Path(value).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}  # jsonargparse says what is wrong with it
    if not isinstance(settings, dict):
        return {}
    model = settings.get("model") if isinstance(settings.get("model"), dict) else {}
    return {**model, **{key.removeprefix("model."): v for key, v in settings.items()
                        if isinstance(key, str) and key.startswith("model.")}}


def refuse_old_options(options: dict, where: str = "") -> None:
    """Raise ConfigError for model options of an earlier version, saying where each moved or why it was removed."""
    said = [line for key, value in options.items() if (line := old_option(key, value))]
    if said:
        raise ConfigError(f"{where}{'; '.join(said)} (the model's options are grouped: optimizer, schedule, "
                          f"augmentation; see --help)")


def add_run_options(parser) -> None:
    """vit-train's own options, besides the Trainer's, the model's and the data's."""
    parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                        help="fit: resume from this checkpoint, or 'last': the newest checkpoint that reads (by the "
                             "time each records it was saved) of the newest run under the root, or of --run; "
                             "test: the checkpoint to evaluate")
    parser.add_argument("--run", type=Optional[str], default=None,
                        help="name the run folder under the root (default: the next version_N); "
                             "with --ckpt_path last, the run to resume")
    parser.add_argument("--test_after_fit", type=bool, default=True,
                        help="test the best checkpoint on the test set when fit ends")
    parser.add_argument("--ddp_timeout", type=PositiveInt, default=600,
                        help="seconds a process may go without starting or finishing a batch (waiting for its "
                             "data, or for the other processes in a collective) before it prints where each of "
                             "its threads is and the run ends with exit 5 (a stuck, dead or desynchronised "
                             "process); a start (loading weights) and the first batch of each image size "
                             "(torch.compile) get an hour, or this if longer; this + 60 s bounds the processes' "
                             "start and how long they wait for each other in a collective (another's longer "
                             "compile)")
    parser.add_argument("--stop_after_minutes", type=Optional[PositiveFloat], default=None,
                        help="end this command in time for a wall-clock limit on it: at the end of the last "
                             "epoch that fits (exit 4); --ckpt_path last continues the run exactly")
    parser.add_argument("--step_checkpoint_minutes", type=Optional[PositiveFloat], default=10.0,
                        help="write <run>/checkpoints/step.ckpt every this many minutes of training, mid-epoch "
                             "(null: never): after a crash, --ckpt_path last resumes from the newer of it and "
                             "last.ckpt, exactly, losing at most this much")
    parser.link_arguments("model.arch.image_size", "data.init_args.image_size")
    parser.link_arguments("data.num_classes", "model.arch.num_classes", apply_on="instantiate")


def refuse_old_command_line(args: list[str]) -> None:
    given = {}
    for i, arg in enumerate(args):
        if arg.startswith("--model."):
            key, equals, value = arg.removeprefix("--model.").partition("=")
            given[key] = value if equals else (args[i + 1] if i + 1 < len(args) else None)
    refuse_old_options(given)


class ViTCLI(LightningCLI):
    def __init__(self, mode: str, argv: list[str], claimed: list[Path]):
        self.mode, self.argv, self.claimed, self.resume = mode, argv, claimed, None
        defaults = configs.default_files(mode, argv)
        import yaml

        set_loader(PARSER_MODE, read_value, exceptions=(yaml.YAMLError,))
        super().__init__(ViTClassifier, L.LightningDataModule, subclass_mode_data=True, run=False, args=argv,
                         save_config_callback=LogConfig, save_config_kwargs={"overwrite": True},
                         auto_configure_optimizers=False,
                         parser_kwargs={"exit_on_error": False, "prog": "vit-train", "epilog": exits.text(),
                                        "parser_mode": PARSER_MODE,
                                        "formatter_class": HelpFormatter,
                                        "description": __doc__.split("\n\n")[0],
                                        "default_config_files": [str(p) for p in defaults]})

    def init_parser(self, **kwargs):
        parser = self.parser_class(**kwargs)
        parser.add_argument("-c", "--config", action=RecipeFile,
                            help=f"a recipe ({', '.join(configs.names())}), a YAML or JSON file, or settings as "
                                 f"one mapping ('{{\"model.optimizer.lr\": 0.001}}'); applied over the "
                                 f"default recipe {configs.DEFAULT} in order")
        return parser

    def add_arguments_to_parser(self, parser):
        add_run_options(parser)

    def parse_arguments(self, parser, args):
        refuse_old_command_line(args)
        self.config = parser.parse_args(args)
        self.configuration = configuration(parser, self.config)

    def before_instantiate_classes(self):
        cfg = self.config
        if str(cfg.trainer.accelerator) in ("auto", "gpu", "cuda"):
            gpus.check_gpus_usable()
        root = Path(cfg.trainer.default_root_dir or runs.runs_folder() / configs.recipe_name(self.argv))
        data = {"class_path": cfg.data.class_path, **vars(cfg.data.init_args)}
        if self.mode == "test":
            if not cfg.ckpt_path or cfg.ckpt_path == "last":
                raise ConfigError("test needs --ckpt_path CKPT, the checkpoint file to evaluate")
            if (processes := launch.processes()) > 1:
                raise ConfigError(f"test evaluates on one process, and this launch has {processes}: "
                                  f"start it as one (srun --ntasks 1, torchrun --nproc-per-node 1 --nnodes 1)")
            ckpt = read_checkpoint(cfg.ckpt_path)
            check_checkpoint(ckpt, cfg.ckpt_path, data)
            hparams = {k: v for k, v in ckpt.get("hyper_parameters", {}).items() if not k.startswith("_")}
            try:
                self.config = cfg = self.parser.parse_object({"model": hparams}, cfg)
            except ArgumentError as e:
                raise CheckpointError(f"{cfg.ckpt_path}: its model's options are not this version's "
                                      f"({failures.condense(str(e))})") from None
            run = runs.run_of(Path(cfg.ckpt_path))
            if run is None:  # (removed again if the test never starts)
                run = runs.claim_new_version(root, self.claimed)
            self.resume = (Path(cfg.ckpt_path), ckpt)
        else:
            if not os.environ.get(runs.ENV):  # (not set: not a process Lightning's launcher started)
                launch.check_slurm_tasks()
                import torch

                cuda = str(cfg.trainer.accelerator) in ("auto", "gpu", "cuda") and torch.cuda.is_available()
                given = getattr(getattr(cfg.trainer.strategy, "init_args", None), "process_group_backend", None)
                backend = given or ("nccl" if cuda else "gloo")  # (as Lightning's DDP would choose)
                if backend == "nccl":
                    gpus.nccl_errors_reach_python()
                launch.join_group(backend, cfg.ddp_timeout + Watchdog.BACKSTOP)
            model = {**vars(cfg.model.arch), "ema": cfg.model.ema_decay is not None}  # (what shapes the weights)
            run, self.resume = runs.open_for_fit(root, cfg.ckpt_path, cfg.run, model, data, self.claimed,
                                                 runs.command_id(self.argv))
            launch.apply_allocation(cfg.trainer)
        os.environ[runs.ENV] = str(run)  # inherited by the processes Lightning's DDP launcher starts
        os.environ[runs.RESUMES] = str(self.resume[0]) if self.resume else ""
        known = self.resume[1].get("vit", {}).get("wandb_run_id") if self.resume else None
        runs.place_outputs(cfg, run, known)

    def instantiate_classes(self) -> None:
        """jsonargparse wraps a BadInput raised in an __init__ in ValueErrors: unwrap it (one line, exit 2)."""
        try:
            super().instantiate_classes()
        except ValueError as e:
            cause = e.__cause__
            while cause is not None and not isinstance(cause, exits.BadInput):
                cause = cause.__cause__
            if cause is None:
                raise
            raise cause from None
        classes = getattr(self.datamodule, "num_classes", None)  # (a user's data module may not say)
        if self.resume and classes is not None:  # (every process has the checkpoint: all refuse alike)
            check_classes(self.resume[1], classes, self.resume[0])
        if self.resume:  # (only process 0 holds the weights: it refuses for all)
            launch.from_process_zero(lambda: check_weights(self.model, *self.resume), "check of its checkpoint")

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        """The configured Trainer, plus the launch's strategy and plugins and the run's own callbacks."""
        config = self.config_init.trainer
        kwargs.update(launch.parallelism(config, self.config.ddp_timeout + Watchdog.BACKSTOP))
        if "strategy" in kwargs:
            gpus.nccl_errors_reach_python()
        configured = config.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        kwargs["callbacks"] = [*configured, *run_callbacks(config, configured, self.config.step_checkpoint_minutes,
                                                           self.config.stop_after_minutes, self.config.ddp_timeout,
                                                           runs.command_id(self.argv))]
        if any(isinstance(c, StepEndTimer) for c in kwargs["callbacks"]):
            kwargs["max_time"] = None  # (StepEndTimer enforces it instead of Lightning's Timer)
        return super().instantiate_trainer(**kwargs)

    def check_batch(self) -> None:
        """Refuse, before any process starts, a global batch that does not split among the processes."""
        if isinstance(getattr(self.datamodule, "batch_size", None), int):
            split_batch(self.datamodule.batch_size, self.trainer.world_size, self.model.mixes_pairs)

    def fit(self) -> None:
        ckpt = str(self.resume[0]) if self.resume else None
        self.check_batch()
        check_validation_interval(self.config.trainer.val_check_interval, self.trainer.accumulate_grad_batches)
        if self.resume:
            check_global_batch(self.resume[1], self.datamodule, self.trainer.accumulate_grad_batches, ckpt)
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
        """Test ``ckpt`` (None: the weights in memory) on one process, then write the run's record and figures."""
        metrics = test_on_one_process(self.trainer, self.model, self.datamodule, ckpt)
        if metrics is None:
            return
        tested, total = self.model.tested_images, len(self.datamodule.test_set)
        limit = self.trainer.limit_test_batches  # the float 1.0 is all batches; the int 1, one batch
        why = "--trainer.limit_test_batches" if limit != 1.0 or isinstance(limit, int) else "the rest unreadable"
        limited = f" (of {total}: {why})" if tested < total else ""
        rank_zero_info(f"test on {tested} images{limited} with {ckpt or 'the final weights'}: "
                       f"top-1 {100 * metrics['test/acc']:.2f}%, top-5 {100 * metrics['test/acc5']:.2f}%")
        record = results.record_run(self.trainer, self.model, self.mode, self.argv, ckpt, metrics,
                                    self.resume and self.resume[1], self.configuration if self.mode == "fit" else None)
        rank_zero_info(f"record: {record}")
        figures = report.publish(Path(self.trainer.default_root_dir), self.model, self.datamodule.test_set,
                                 self.trainer.loggers)
        if figures:
            rank_zero_info(f"figures: {', '.join(str(f) for f in figures)}")


def test_on_one_process(trainer: L.Trainer, model, datamodule, ckpt: str | None) -> dict | None:
    """Test metrics on rank zero alone, so each test image counts once; None on the other ranks."""
    import torch

    if trainer.world_size > 1:
        torch.distributed.barrier()  # all fits have ended before the group (whose store the Watchdog reads) goes
        if not trainer.is_global_zero:
            return None
        torch.distributed.destroy_process_group()
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # device and restore lines were printed already
    tester = L.Trainer(accelerator=trainer.accelerator, devices=1, num_nodes=1, logger=trainer.loggers,
                       precision=trainer.precision_plugin.precision, plugins=[LightningEnvironment()],
                       callbacks=[ProgressBar()] if trainer.progress_bar_callback else [],
                       enable_checkpointing=False, default_root_dir=trainer.default_root_dir,
                       limit_test_batches=trainer.limit_test_batches,
                       enable_progress_bar=trainer.progress_bar_callback is not None)
    try:
        (metrics,) = tester.test(model, datamodule=datamodule, ckpt_path=ckpt, verbose=False)
    finally:
        quiet.setLevel(level)
    return metrics


class _Built(Exception):
    """Ends a ViTCLI's construction once its parser is built (nothing parsed, nothing made)."""


def training_parser():
    """vit-train's fit parser, built once to check many command lines."""
    class Build(ViTCLI):
        def parse_arguments(self, parser, args):
            raise _Built(parser)

    try:
        Build("fit", ["--config", configs.DEFAULT], [])  # (a recipe named: no line on the CPU recipe)
    except _Built as built:
        return built.args[0]
    raise AssertionError("ViTCLI parsed no arguments")


# options that only place a run's files or limit one command: not part of its configuration
PLACES = ("data.init_args.root", "trainer.default_root_dir", "run", "ckpt_path", "stop_after_minutes",
          "step_checkpoint_minutes", "ddp_timeout")


def configuration(parser, cfg) -> dict:
    """A fit's effective configuration, flat and JSON-safe, without PLACES; equal ones train the same run."""
    import json

    import yaml

    def flat(value, prefix=""):
        if isinstance(value, dict):
            return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
        return {prefix[:-1]: value}

    options = flat(yaml.safe_load(parser.dump(cfg, skip_none=False, skip_validation=True)))
    return json.loads(json.dumps({k: v for k, v in sorted(options.items()) if k not in PLACES}, default=str))


def check_arguments(parser, argv: list[str], note: bool = True) -> dict:
    """A fit command line's configuration, parsed as vit-train would (ConfigError if bad); ``note``: name the recipe."""
    parser.default_config_files = [str(p) for p in configs.default_files("fit", argv, note)]
    refuse_old_command_line(argv)
    try:
        return configuration(parser, parser.parse_args(argv))
    except ArgumentError as e:
        raise ConfigError(failures.condense(str(e))) from None


class ArgumentCheck:
    """``check_arguments`` with a lazily built parser, for a plan's Runner (the library imports no command)."""

    def __init__(self):
        self.parser = None

    def __call__(self, argv: list[str], note: bool = True) -> dict:
        self.parser = self.parser or training_parser()
        return check_arguments(self.parser, argv, note)


def stop_before_training(signum, frame) -> None:
    """SIGUSR1 before training (StopOnSignal handles it later): exit 4, which the job script requeues."""
    raise Stopped("SIGUSR1 (SLURM's notice of a time limit or a preemption) came before training started: nothing "
                  "to save yet; the job's script requeues the job, which starts the run again")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv.pop(0) if argv and argv[0] in MODES else "fit"
    if launch.slurm_job() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, stop_before_training)
    quiet_third_party()
    claimed: list[Path] = []  # folders this process created for its run, in order
    inherited = runs.ENV in os.environ  # set by the process that launched this one (DDP)
    code = 1  # a bug, unless the run ends otherwise below
    commits.commit()  # the code that runs, before anyone edits the tree
    cli = None
    try:
        cli = ViTCLI(mode, argv, claimed)
        if mode == "fit":
            cli.fit()
        else:
            cli.test(str(cli.resume[0]))
    except Exception as error:  # known failures become one line; a bug is raised again
        folder = os.environ.get(runs.ENV)
        known = failures.line_and_status(error, failures.Training(argv, folder and Path(folder),
                                                                  cli and cli.datamodule))
        if known is None:
            raise
        message, code = known
        if code == exits.status_of(exits.LostProcesses()):  # every process says it: the failed one may not be rank 0
            print(failures.said(message, code), file=sys.stderr)
            return code
    else:
        code = 0
        return code
    finally:
        if not inherited:
            os.environ.pop(runs.ENV, None)
            os.environ.pop(runs.RESUMES, None)
        # ignore a later SIGUSR1 (a second scancel, SLURM's warning): as Python exits it restores the default
        # handler, and dying by the signal (exit 138) would not be requeued by the job script
        if launch.slurm_job() and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        loggers.end_wandb_run(code)
        # remove the folders of a run that never started, while its lock is still held
        for folder in reversed(claimed if code else []):
            with contextlib.suppress(OSError):  # (gone, or holding another start's folder: kept)
                names = {p.name for p in folder.iterdir()}  # (another start's lock file: its folder, kept)
                if names <= {runs.WANDB_ID, run_lock.LOCK} and (run_lock.LOCK not in names or run_lock.holds(folder)):
                    # the lock file last: a start of the same run that opens it is refused, a later one makes anew
                    for left in sorted(folder.iterdir(), key=lambda p: p.name == run_lock.LOCK):
                        left.unlink()
                    folder.rmdir()
        run_lock.release()  # (after W&B's end: the folder is this run's until then)
        bug = sys.exc_info()[1]
        if code == 1 and isinstance(bug, Exception):
            launch.say_failure(code, f"a bug, whose traceback that process prints: {type(bug).__name__}: "
                                     f"{failures.first_line(bug)}", None, False)
    # a full disk or out-of-memory is one process's own; the others every process may meet alike
    alike = code in [exits.status_of(e()) for e in (exits.BadInput, exits.TrainingDiverged, exits.Stopped)]
    launch.say_failure(code, message, failures.said(message, code), alike)
    return code
