"""`python scripts/train.py`: LightningCLI that fits, then tests the best checkpoint on one process."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from jsonargparse import ArgumentError
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from vit.data import DatasetError
from vit.training import ViTClassifier, WandbLogger

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "vit_cifar10.yaml"


class ViTCLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        parser.add_argument("--ckpt_path", default=None,
                            help="resume from this checkpoint, or 'last' for the run's last.ckpt")
        parser.add_argument("--test_after_fit", type=bool, default=True,
                            help="test the best checkpoint on the test set when fit ends")
        parser.link_arguments("model.image_size", "data.init_args.image_size")
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")


def resolve_ckpt_path(trainer: L.Trainer, ckpt_path: str | None) -> str | None:
    """'last' → the newest last*.ckpt in the checkpoint folders (None: nothing to resume yet)."""
    if ckpt_path != "last":
        if ckpt_path and not Path(ckpt_path).is_file():
            raise FileNotFoundError(f"--ckpt_path {ckpt_path}: no such checkpoint file")
        return ckpt_path
    found = [p for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)
             for p in Path(cb.dirpath).glob(f"{cb.CHECKPOINT_NAME_LAST}*.ckpt")]
    if not found:
        rank_zero_info("--ckpt_path last: no last checkpoint yet, starting from scratch")
        return None
    return str(max(found, key=lambda p: p.stat().st_mtime))


def resume_wandb(trainer: L.Trainer, ckpt_path: str | None) -> None:
    """A resumed training continues the W&B run its checkpoint was logged to."""
    if ckpt_path and isinstance(trainer.logger, WandbLogger):
        run_id = torch.load(ckpt_path, map_location="cpu", weights_only=True).get("vit", {}).get("wandb_run_id")
        if run_id:
            trainer.logger.resume(run_id)


def test_on_one_process(cli: LightningCLI) -> None:
    """Test the best checkpoint on a single process, so each test image counts exactly once."""
    trainer = cli.trainer
    ckpt = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else None
    if trainer.world_size > 1:
        if not trainer.is_global_zero:
            return
        torch.distributed.destroy_process_group()
    warnings.filterwarnings("ignore", message=".*when using `ckpt_path`, callbacks used to create")
    tester = L.Trainer(accelerator=trainer.accelerator, devices=1, num_nodes=1, logger=trainer.logger,
                       precision=trainer.precision_plugin.precision, plugins=[LightningEnvironment()],
                       callbacks=[], enable_checkpointing=False, default_root_dir=trainer.default_root_dir)
    (metrics,) = tester.test(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt or None, verbose=False)
    rank_zero_info(f"test on {len(cli.datamodule.test_set)} images with {ckpt or 'the final weights'}: "
                   f"top-1 {100 * metrics['test/acc']:.2f}%, top-5 {100 * metrics['test/acc5']:.2f}%")


def condense(message: str) -> str:
    """jsonargparse explains a bad value of a subclass-typed field as every alternative it tried;
    keep the reasons that are not about the alternatives, on one line."""
    lines = [line.strip().removeprefix("- ") for line in message.splitlines()]
    reasons = [line for line in lines if line and not line.startswith(("Expected a <class 'NoneType'>", "Given value",
                                                                        "Subtypes:", "Errors:", "Does not validate"))]
    return " ".join(r if r.endswith(":") or i == len(reasons) - 1 else r + ";" for i, r in enumerate(reasons)) \
        or " ".join(message.split())


def main(args: list[str] | None = None) -> int:
    from_argv = args is None
    args = list(sys.argv[1:] if from_argv else args)
    if not any(a in ("-h", "--help", "-c") or a.split("=")[0] == "--config" for a in args):
        args = ["--config", str(DEFAULT_CONFIG), *args]
    if from_argv:  # LightningCLI reads sys.argv itself (and so does a DDP launcher re-running us)
        sys.argv[1:], args = args, None
    try:
        cli = ViTCLI(ViTClassifier, L.LightningDataModule, subclass_mode_data=True, run=False, args=args,
                     save_config_kwargs={"overwrite": True}, auto_configure_optimizers=False,
                     parser_kwargs={"exit_on_error": False})
        ckpt_path = resolve_ckpt_path(cli.trainer, cli.config.get("ckpt_path"))
        resume_wandb(cli.trainer, ckpt_path)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
        if cli.config.get("test_after_fit") and not cli.trainer.interrupted:
            test_on_one_process(cli)
    except (ArgumentError, DatasetError, ValueError, FileNotFoundError, MisconfigurationException) as e:
        if rank_zero_only.rank == 0:  # under DDP every process fails alike: say it once
            print(f"error: {condense(str(e))}", file=sys.stderr)
        return 2
    return 0
