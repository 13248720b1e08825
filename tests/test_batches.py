"""Every --data.batch_size that vit-train accepts trains: for each recipe, on 1 and on 2 processes, a global
batch either completes an optimizer step or is refused before training with one line and exit 2, naming the
nearest sizes that work (vit.data.datamodules.split_batch). The global batch is never changed for the user."""

import re

import pytest

from vit import configs
from vit.data.datamodules import MIN_SHARE, split_batch
from vit.exits import ConfigError

MIXING = {"vit_cifar10", "vit_cifar10_fast", "vit_cifar10_lee", "vit_tiny_cifar10"}  # Mixup/CutMix on (timm's needs an even batch)


def mixes(recipe: str) -> bool:
    """Whether the recipe, as its files say (over the default one), has Mixup or CutMix on."""
    import yaml

    aug = {}
    for name in dict.fromkeys([configs.DEFAULT, recipe]):
        aug.update((yaml.safe_load(configs.path(name).read_text()).get("model") or {}).get("augmentation") or {})
    return (aug.get("mixup", 0) > 0 or aug.get("cutmix", 0) > 0) and aug.get("mix_prob", 1.0) > 0


def test_the_recipes_that_mix_are_known():
    assert {r for r in configs.names() if mixes(r)} == MIXING


def accepted(batch: int, world: int, pairs: bool) -> bool:
    """What the split must accept, written out: equal shares, at least MIN_SHARE each on several processes,
    even shares under Mixup/CutMix."""
    share, rest = divmod(batch, world)
    return rest == 0 and share >= (MIN_SHARE if world > 1 else 1) and not (pairs and share % 2)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("recipe", configs.names())
def test_every_global_batch_splits_or_is_refused_with_the_nearest_sizes_that_work(recipe, world):
    pairs = mixes(recipe)
    for batch in range(1, 257):
        if accepted(batch, world, pairs):
            assert split_batch(batch, world, pairs) * world == batch  # the global batch, unchanged
            continue
        with pytest.raises(ConfigError) as refused:
            split_batch(batch, world, pairs)
        message = str(refused.value)
        assert "\n" not in message and f"--data.batch_size {batch} " in message
        named = [int(n) for n in re.findall(r"(?:e\.g\.|use|or|to) (\d+)", message)]
        assert named and all(accepted(n, world, pairs) for n in named), message
        below = [n for n in range(1, batch) if accepted(n, world, pairs)]
        above = next(n for n in range(batch + 1, 10 * batch + 64) if accepted(n, world, pairs))
        assert above in named and (not below or below[-1] in named or "or more" in message), message
        if pairs and batch % world == 0 and batch // world >= (MIN_SHARE if world > 1 else 1):
            assert "Mixup/CutMix" in message


# Each recipe with its own batch-related settings (Mixup/CutMix, data pipeline, accumulation none), on a tiny
# model in fp32 (bf16 is emulated on this CPU, and the batch rules do not depend on the precision or the width)
TINY = ["--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2", "--model.compile", "false",
        "--trainer.precision", "32-true", "--trainer.accelerator", "cpu", "--trainer.devices", "1"]


def share_of(batch: int, world: int, pairs: bool) -> int | None:
    """The images one process trains per step, or None when the split refuses ``batch``."""
    try:
        return split_batch(batch, world, pairs)
    except ConfigError:
        return None


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    """finetune_cifar10's timm weights, randomly initialised at the tiny width (no download here)."""
    import timm
    import torch

    path = tmp_path_factory.mktemp("weights") / "tiny.pth"
    model = timm.create_model("vit_small_patch16_224", pretrained=False, embed_dim=16, depth=1, num_heads=2)
    torch.save(model.state_dict(), path)
    return path


# 1 and 2 processes' global batches: odd and even, the smallest, a whole training set (400) and one more
SIZES = {1: [1, 2, 15, 16, 400, 401], 2: [2, 15, 16, 30, 32]}


# Here, one recipe of each kind of batch: each data pipeline, with and without Mixup/CutMix; the others, whose
# batch settings are one of these kinds (vit_tiny_cifar10: vit_cifar10's, finetune_cifar10: smoke's at 224 px),
# in make test-long
KINDS = {"smoke", "cpu", "vit_cifar10", "vit_cifar10_fast"}


def kind(recipe: str) -> tuple[bool, str]:
    """Whether the recipe mixes, and its data pipeline, as its files say (over the default one)."""
    import yaml

    pipeline = "workers"
    for name in dict.fromkeys([configs.DEFAULT, recipe]):
        data = yaml.safe_load(configs.path(name).read_text()).get("data") or {}
        pipeline = (data.get("init_args") or {}).get("pipeline", pipeline)
    return mixes(recipe), pipeline


def test_each_kind_of_batch_trains_in_make_test():
    assert {kind(r) for r in KINDS} == {kind(r) for r in configs.names()} and len(KINDS) == 4


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("recipe", [r if r in KINDS else pytest.param(r, marks=pytest.mark.long)
                                    for r in configs.names()])
def test_an_accepted_batch_completes_an_optimizer_step_and_a_refused_one_is_one_line(
        recipe, world, tmp_path, fake_cifar_session, tiny_weights, capsys, monkeypatch):
    """vit-train's main() in this process. A global batch the 2-process split accepts is trained here as the
    share each of the 2 processes trains (tests/cluster/test_ddp.py runs real 2-process ones)."""
    from vit.commands.train import main

    pairs = mixes(recipe)
    extra = ["--model.pretrained", str(tiny_weights)] if recipe == "finetune_cifar10" else []
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for i, batch in enumerate(SIZES[world]):
        share = share_of(batch, world, pairs)
        if world > 1 and (share is None or share in SIZES[1]):
            # refused by the 2-process split (test_every_global_batch_splits_or_is_refused_... checks the line),
            # or a share that the 1-process case trains as its global batch: that very run
            continue
        run = tmp_path / str(i)
        run.mkdir()
        monkeypatch.chdir(run)
        code = main(["--config", recipe, *extra, *TINY, "--trainer.enable_model_summary", "false", "--data.root", str(fake_cifar_session),
                     "--data.val_size", "100", "--data.num_workers", "0", "--trainer.max_steps", "1",
                     "--trainer.num_sanity_val_steps", "0", "--trainer.logger", "false", "--test_after_fit", "false",
                     "--trainer.callbacks+=callbacks.CountSteps",
                     "--data.batch_size", str(share if world > 1 and share else batch)])
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        if share is not None and batch <= 400:  # the training set's 400 images
            assert code == 0, (batch, err[-3000:])
            (steps,) = (run / "runs").glob("*/version_0/steps.0")
            assert steps.read_text().split() == ["1"], batch  # one optimizer step, done
        else:
            assert code == 2 and len(errors) == 1 and "Traceback" not in err, (batch, err[-3000:])
            assert re.search(r"(an odd number.*use \d+|fewer than one batch of \d+)", errors[0]), errors[0]


def test_the_out_of_memory_advice_keeps_each_steps_images_in_a_split_the_cli_accepts(tmp_path, monkeypatch,
                                                                                      fake_cifar_session):
    """2 processes, --trainer.accumulate_grad_batches 2, the default recipe (Mixup: even shares): the flags the
    out-of-memory line gives pass vit-train's own check on 2 processes, and keep the images (and so the lr) of
    each optimizer step; where each process already takes the fewest images it may (8), the line says so."""
    import torch

    from vit.cluster import runs
    from vit.commands.train import ViTCLI
    from vit.training.memory import out_of_memory_message

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for key in (runs.ENV, runs.RESUMES):  # the run folder each ViTCLI names there is forgotten after the test
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)

    def cli(*flags: str) -> ViTCLI:
        made = ViTCLI("fit", ["--config", "vit_cifar10", "--data.root", str(fake_cifar_session), "--trainer.devices",
                              "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu", "--trainer.logger",
                              "false", "--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads",
                              "2", *flags], [])
        assert made.trainer.world_size == 2
        made.check_batch()  # what vit-train does before it starts the processes: refuses, or passes
        made.trainer.strategy.connect(made.model)
        made.datamodule.trainer = made.trainer
        return made

    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    for total in (16, 24, 32, 48, 64, 128, 200):
        message = out_of_memory_message(oom, cli("--data.batch_size", str(total),
                                                 "--trainer.accumulate_grad_batches", "2").datamodule)
        assert "\n" not in message and f"with {total // 2} images per device" in message
        advised = re.search(r"Try --data.batch_size (\d+) --trainer.accumulate_grad_batches (\d+) \(the same "
                            rf"{2 * total} images and lr per optimizer step, (\d+) per device at a time\)", message)
        if total // 2 < 2 * MIN_SHARE:  # no smaller even share of 8 or more
            assert advised is None and "Each device already takes the fewest images the split allows; try a smaller" in message
            continue
        assert advised, message
        batch, k, share = map(int, advised.groups())
        assert batch * k == 2 * total and share < total // 2 and share >= MIN_SHARE
        again = cli("--data.batch_size", str(batch), "--trainer.accumulate_grad_batches", str(k))
        assert again.datamodule.process_batch() == share and again.trainer.accumulate_grad_batches == k


def folders(root, classes: int = 4, per_class: int = 10):
    from helpers import write_images

    for i, colour in enumerate([(200, 20, 20), (20, 200, 20), (20, 20, 200), (200, 200, 20)][:classes]):
        write_images(root / "train" / f"c{i}", per_class, colour, size=24, seed=i)
    return root


def test_a_batch_whose_images_all_fail_to_load_is_skipped_naming_its_files(tmp_path, monkeypatch, capsys):
    """Image folders, 36 training images in 9 batches of 4; the files of batch 3 are damaged after the setup
    check: that batch is skipped with one line naming its 4 files, and the epoch trains the other 8, validates
    and ends as any epoch (its checkpoints, the test)."""
    from vit.commands.train import main

    root = folders(tmp_path / "photos")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    code = main(["--config", "smoke", "--data", "vit.data.ImageFolderDataModule", "--data.root", str(root),
                 "--data.batch_size", "4", "--data.val_size", "4", "--data.num_workers", "0", "--trainer.max_epochs",
                 "1", "--trainer.logger", "false", "--trainer.callbacks+=callbacks.BreakBatch",
                 "--trainer.callbacks+=callbacks.CountSteps", "--trainer.enable_model_summary", "false"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    (skipped,) = [line for line in err.splitlines() if "skipped a training batch" in line]
    named = re.search(r"warning: skipped a training batch: none of its images could be read \((.*)\)$", skipped)
    assert named and len(named.group(1).split(", ")) == 4 and all(str(root) in p for p in named.group(1).split(", "))
    run = tmp_path / "runs/smoke/version_0"
    assert (run / "steps.0").read_text().split() == [str(s) for s in range(1, 9)]
    assert "Traceback" not in err and load_ckpt(run / "checkpoints/last.ckpt")["global_step"] == 8


def load_ckpt(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def test_a_skipped_batch_counts_in_the_data_position_so_a_resume_reads_on_where_the_run_stopped(tmp_path):
    """The loader's position in a checkpoint is the images of the batches the loop consumed plus those skipped
    before them: resumed after 2 or 4 consumed batches (batch 2 of the loader skipped), the loader gives what
    the uninterrupted one gave after them."""
    from types import SimpleNamespace

    from vit.data.datamodules import ImageFolderDataModule
    from vit.data.resume import DataPosition, EpochOrder

    dm = ImageFolderDataModule(root=str(folders(tmp_path / "photos")), batch_size=4, val_size=4, num_workers=0)
    dm.setup("fit")
    order = [index for index, _ in EpochOrder(dm.train_set, 4, dm.seed, DataPosition())]
    for index in order[8:12]:  # loader batch 2 of epoch 0
        with open(dm.train_set.dataset.samples[dm.train_set.indices[index]][0], "w") as f:
            f.write("no longer an image")

    def labels(loader):
        return [(batch[1].tolist(), int(batch[0].long().sum())) for batch in loader]

    dm.position.epochs = 0
    whole = labels(dm.train_dataloader())
    assert len(whole) == 8 and dm.position.skipped == [2]
    for consumed, position in ((2, 2), (4, 5)):
        done = SimpleNamespace(num_training_batches=9, fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(
            batch_progress=SimpleNamespace(current=SimpleNamespace(processed=consumed), is_last_batch=False))))
        state = dm.position.state_dict(done, 4, 4)
        assert (state["epoch"], state["images"], state["skipped_images"]) == \
            (0, 4 * position, 4 * (position - consumed))
        dm.position.load_state_dict(state)
        assert labels(dm.train_dataloader()) == whole[consumed:]


def test_evaluation_takes_any_batch_under_mixup(fake_cifar):
    """Mixup/CutMix mixes training batches only: a test or validation batch may be odd (vit-train test)."""
    from types import SimpleNamespace

    import torch

    from vit.data.datamodules import CIFAR10DataModule

    dm = CIFAR10DataModule(root=str(fake_cifar), val_size=100, num_workers=0, batch_size=31)
    dm.trainer = SimpleNamespace(world_size=1, global_rank=0, accumulate_grad_batches=1,
                                 lightning_module=SimpleNamespace(mixes_pairs=True),
                                 strategy=SimpleNamespace(root_device=torch.device("cpu")))
    dm.setup("fit")
    assert [len(labels) for _, labels in dm.val_dataloader()] == [31, 31, 31, 7]
    with pytest.raises(ConfigError, match="use 30 or 32"):
        dm.train_dataloader()


def test_a_batch_that_lost_images_keeps_pairs_under_mixup_and_names_its_files_when_none_is_left():
    import torch

    from vit.data.datamodules import Unreadable, UnreadableBatch, _skip_unreadable

    good = [(torch.zeros(3, 4, 4, dtype=torch.uint8), i) for i in range(3)]
    images, labels = _skip_unreadable([*good, Unreadable("d.png")], pairs=True)
    assert labels.tolist() == [0, 1]  # Mixup/CutMix mixes pairs: 2 of the 3 readable images
    images, labels = _skip_unreadable([*good, Unreadable("d.png")])
    assert labels.tolist() == [0, 1, 2]
    assert _skip_unreadable([good[0], Unreadable("b.png")], pairs=True) == UnreadableBatch(["b.png"])
    assert _skip_unreadable([Unreadable("a.png"), Unreadable("b.png")]) == ["a.png", "b.png"]
