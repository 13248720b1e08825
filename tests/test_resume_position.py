"""A resumed run starts at its checkpoint's image or not at all: a place in the data that the new split's loader
batches cannot reach exactly (after skipped unreadable batches), one inside an optimizer step (a validation
there wrote it), and a checkpoint of an earlier version whose global batch or split is not the resumed run's
(or cannot be read from it) are refused before training with one line and exit 2, never rounded down to the
batch before (vit.data.resume.check_global_batch). The splits that reach it resume exactly: tests/test_resume_split.py,
tests/test_accumulation.py."""

from types import SimpleNamespace

import pytest
import torch

from helpers import QUIET, TESTS, errors_of, load, train_here
from vit.exits import ConfigError
from vit.data.resume import DataPosition, check_global_batch

TINY = ["--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2", "--trainer.max_epochs", "2",
        "--trainer.logger", "false", "--test_after_fit", "false", *QUIET]
CIFAR10DataModule = type("CIFAR10DataModule", (SimpleNamespace,), {})  # (the name the state is kept under)


def split(batch: int, accumulate: int) -> list[str]:
    return ["--data.batch_size", str(batch), "--trainer.accumulate_grad_batches", str(accumulate)]


def checkpoint(state: dict, last_batch: bool = False, **rest) -> dict:
    return {"CIFAR10DataModule": state, **rest,
            "loops": {"fit_loop": {"epoch_loop.batch_progress": {"is_last_batch": last_batch}}}}


def refused(ckpt: dict, batch: int, accumulate: int) -> str | None:
    try:
        check_global_batch(ckpt, CIFAR10DataModule(batch_size=batch), accumulate, "c.ckpt")
    except ConfigError as e:
        return str(e)
    return None


# --- the position in images (checkpoints of this version) --------------------------------------------------------

def test_a_validation_inside_an_accumulation_window_is_refused_before_training(tmp_path, fake_cifar_session, capsys):
    """32 × 2, validating every 3 loader batches: the validation after batch 3 would be inside optimizer step 2, and
    its last.ckpt would hold the weights before that step without the gradients of batch 3, which no split resumes
    exactly. Refused before training, as a fraction of an epoch and a time are; every 2 or 4 batches is not."""
    for every in ("3", "0.5", "00:00:00:30"):
        assert train_here(tmp_path, fake_cifar_session, *TINY, *split(32, 2), "--trainer.val_check_interval",
                          every) == 2
        (error,) = errors_of(capsys)
        assert error.startswith(f"error: --trainer.val_check_interval {every} validates inside an optimizer step of "
                                f"--trainer.accumulate_grad_batches 2 batches"), error
    assert not (tmp_path / "runs/smoke/version_0/checkpoints").exists()
    assert train_here(tmp_path, fake_cifar_session, *TINY, *split(32, 2), "--trainer.val_check_interval", "4",
                      "--trainer.max_steps", "2") == 0
    assert load(tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt")["CIFAR10DataModule"]["images"] == 128


def test_the_time_limit_looks_at_the_clock_where_optimizer_steps_end_only():
    """A spent budget stops the run at the end of a check step (vit.training.agreement: every log_every_n_steps
    optimizer steps, 2 here): batch 4 of 2 × 2 batches a step, not inside an accumulation window (batch 3),
    where Lightning's own Timer stops, nor at step 1; the schedule reads the clock agreed there; the state is
    kept under the Timer's key."""
    from lightning.pytorch.callbacks import Timer

    from vit.data.resume import StepEndTimer
    from vit.training.agreement import Agreement
    from vit.training.schedule import shared_clock

    progress = SimpleNamespace(current=SimpleNamespace(processed=0), is_last_batch=False)
    timer, agreement = StepEndTimer("00:00:00:00"), Agreement()
    trainer = SimpleNamespace(should_stop=False, accumulate_grad_batches=2, num_training_batches=16, global_step=0,
                              log_every_n_steps=2, is_global_zero=True, world_size=1, callbacks=[timer, agreement],
                              strategy=SimpleNamespace(root_device=torch.device("cpu")),
                              fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))
    timer.on_train_start(trainer, None)
    stops = []
    for processed in range(1, 9):
        progress.current.processed, trainer.global_step = processed, processed // 2
        trainer.should_stop = False
        for callback in trainer.callbacks:
            callback.on_train_batch_end(trainer, None, None, None, processed - 1)
        stops.append(trainer.should_stop)
    assert stops == [False, False, False, True, False, False, False, True]
    assert shared_clock(trainer) == agreement.clock and agreement.clock[1] == pytest.approx(0, abs=0.01)  # (0 s)
    assert timer.state_key == Timer(duration="00:00:00:00").state_key == "Timer"


@pytest.mark.long
def test_a_time_limited_run_with_accumulation_resumes_in_another_split_with_its_elapsed_time(tmp_path,
                                                                                          fake_cifar_session):
    """--trainer.max_time with 32 × 2: last.ckpt is at an optimizer step's end and resumes as 64 × 1; the elapsed
    time resumes with it (a budget it has spent already trains no step)."""
    run = ["--trainer.max_epochs", "-1", "--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2",
           "--trainer.logger", "false", "--test_after_fit", "false", *QUIET]
    assert train_here(tmp_path, fake_cifar_session, *run, *split(32, 2), "--trainer.max_time", "00:00:00:02") == 0
    last = tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt"
    ckpt = load(last)
    assert ckpt["CIFAR10DataModule"]["images"] % 64 == 0 and ckpt["global_step"] > 0
    elapsed = ckpt["callbacks"]["Timer"]["time_elapsed"]["train"]
    assert train_here(tmp_path, fake_cifar_session, *run, *split(64, 1), "--trainer.max_time", "00:00:00:02",
                      "--ckpt_path", "last") == 0
    assert elapsed >= 2 and load(last)["global_step"] == ckpt["global_step"]  # spent: not a step more
    budget = f"00:00:00:{int(elapsed) + 3:02d}"
    assert train_here(tmp_path, fake_cifar_session, *run, *split(64, 1), "--trainer.max_time", budget,
                      "--ckpt_path", "last") == 0
    assert load(last)["global_step"] > ckpt["global_step"]


def test_a_limited_epoch_ends_where_the_limit_ends_it(tmp_path, fake_cifar_session):
    """--trainer.limit_train_batches 3 with 32 × 2: the epoch ends after batch 3 (a step of 1 batch), recorded as its
    end, and the run resumes as written, starting epoch 1."""
    run = [*TINY, *split(32, 2), "--trainer.limit_train_batches", "3"]
    assert train_here(tmp_path, fake_cifar_session, *run, "--trainer.max_epochs", "1") == 0
    last = tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt"
    assert load(last)["CIFAR10DataModule"]["epoch_end"] is True
    assert train_here(tmp_path, fake_cifar_session, *run, "--ckpt_path", "last") == 0
    state = load(last)["CIFAR10DataModule"]
    assert (state["epoch"], state["epoch_end"]) == (1, True)


def test_a_place_after_a_skipped_batch_is_refused_where_the_new_loader_batches_cannot_reach_it(tmp_path, capsys):
    """Image folders, 2 × 2: loader batch 1 of epoch 0 is unreadable and skipped, so step 2, where
    --trainer.max_steps stops the run and its last.ckpt is written, ends at image 10 (4 batches trained, 1 skipped). Resumed as 4 × 1 (the same global batch) it would start at image 8 and train
    images 8 and 9 twice: refused before training, naming the splits that reach it."""
    from helpers import write_images

    root = tmp_path / "photos"
    for i, colour in enumerate([(200, 20, 20), (20, 200, 20), (20, 20, 200), (200, 200, 20)]):
        write_images(root / "train" / f"c{i}", 10, colour, size=24, seed=i)
    data = ["--data", "vit.data.ImageFolderDataModule", "--data.root", str(root), "--data.val_size", "4",
            "--data.num_workers", "0"]
    assert train_here(tmp_path, None, *TINY, *data, *split(2, 2), "--trainer.max_steps", "2",
                      "--trainer.callbacks+=callbacks.BreakBatch", "--trainer.callbacks.batch", "1") == 0
    step = tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt"  # (Lightning's, where max_steps stopped it)
    assert load(step)["global_step"] == 2
    assert load(step)["ImageFolderDataModule"].items() >= {
        "train_epochs": 1, "epoch": 0, "images": 10, "skipped_images": 2, "batch_images": 2, "step_images": 4,
        "epoch_end": False}.items()
    capsys.readouterr()
    assert train_here(tmp_path, None, *TINY, *data, *split(4, 1), "--ckpt_path", "last") == 2
    assert errors_of(capsys) == [
        f"error: {step.relative_to(tmp_path)}: its place in the data is image 10 of epoch 0, after 1 unreadable loader "
        "batch(es) of 2 images it skipped, which this run's loader batches of 4 images (--data.batch_size 4) do not "
        "reach: resume it with a --data.batch_size that divides 2 and --data.batch_size × "
        "--trainer.accumulate_grad_batches = 4, e.g. as it was written: --data.batch_size 2 "
        "--trainer.accumulate_grad_batches 2"]


def test_an_epochs_end_after_skipped_last_batches_resumes_in_another_split(tmp_path, capsys):
    """Image folders, 2 × 2, 18 loader batches an epoch: the last one, unreadable, is skipped, so Lightning's loop
    never takes the epoch's last batch. The epoch's end is the data position's own record: resumed as 4 × 1, the run
    starts epoch 1."""
    from helpers import write_images

    root = tmp_path / "photos"
    for i, colour in enumerate([(200, 20, 20), (20, 200, 20), (20, 20, 200), (200, 200, 20)]):
        write_images(root / "train" / f"c{i}", 10, colour, size=24, seed=i)
    data = ["--data", "vit.data.ImageFolderDataModule", "--data.root", str(root), "--data.val_size", "4",
            "--data.num_workers", "0"]
    one = [*TINY, "--trainer.max_epochs", "1"]
    assert train_here(tmp_path, None, *one, *data, *split(2, 2), "--trainer.callbacks+=callbacks.BreakBatch",
                      "--trainer.callbacks.batch", "17") == 0
    ckpt = load(tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt")
    assert ckpt["ImageFolderDataModule"].items() >= {"train_epochs": 1, "epoch": 0, "images": 36, "skipped_images": 2,
                                                     "batch_images": 2, "step_images": 4, "epoch_end": True}.items()
    capsys.readouterr()
    assert train_here(tmp_path, None, *TINY, *data, *split(4, 1), "--ckpt_path", "last") == 0, capsys.readouterr().err
    assert load(tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt")["ImageFolderDataModule"]["epoch"] == 1


SKIPPED = {"epoch": 1, "images": 96, "skipped_images": 32, "batch_images": 32, "step_images": 64}  # 1 step, 1 skip


@pytest.mark.parametrize("batch,accumulate,ok", [(32, 2, True), (16, 4, True), (8, 8, True), (64, 1, False)])
def test_the_splits_that_reach_a_place_after_a_skipped_batch(batch, accumulate, ok):
    error = refused(checkpoint(SKIPPED), batch, accumulate)
    assert (error is None) == ok, error
    assert ok or error.startswith("c.ckpt: its place in the data is image 96 of epoch 1, after 1 unreadable")


def test_an_epochs_end_fits_every_split_and_the_start_of_an_epoch_too():
    """At an epoch's end the resumed run starts the next epoch: the place (here the epoch's 384 images, 1 batch
    of 32 skipped) is not used."""
    end = {"epoch": 0, "images": 384, "skipped_images": 32, "batch_images": 32, "step_images": 64}
    assert refused(checkpoint(end, last_batch=True), 64, 1) is None
    assert refused(checkpoint(SKIPPED | {"images": 0, "skipped_images": 0}), 64, 1) is None
    inside = {"epoch": 0, "images": 96, "skipped_images": 0, "batch_images": 32, "step_images": 64}
    assert refused(checkpoint(inside, last_batch=True), 64, 1) is None
    assert "written inside an optimizer step, after 1 of its 2" in refused(checkpoint(inside), 64, 1)


def test_the_data_position_refuses_a_place_between_two_batches_instead_of_rounding_it_down():
    """The last guard, where the loader starts: 10 images into an epoch of 9 batches of 4 (the check before
    training refuses it first)."""
    position = DataPosition()
    position.load_state_dict({"train_epochs": 1, "epoch": 0, "images": 10, "skipped_images": 2})
    with pytest.raises(ConfigError, match=r"^the checkpoint's place in the data, image 10 of epoch 0 \(2 of them in "
                                          r"skipped batches\), is not a whole number of this run's loader batches "
                                          r"of 4 images"):
        position.begin(9, 4)
    position.load_state_dict({"train_epochs": 1, "epoch": 0, "images": 10, "skipped_images": 2})
    assert position.begin(18, 2) == (0, 5) and position.yielded == 4 and position.skipped == [-1]


# --- checkpoints of an earlier version (the position in its own loader batches, no global batch) ---------------

OLD = TESTS / "data" / "flat-options.ckpt"


def test_an_earlier_versions_checkpoint_is_refused_in_one_line_before_any_work_and_tests_as_before(tmp_path, capsys):
    """tests/data/flat-options.ckpt kept its place in the data in loader batches: no run continues it exactly (its
    split was recorded nowhere), so a resume is refused in one line, before any work; a test of it still runs."""
    from helpers import make_fake_cifar

    raw = torch.load(OLD, map_location="cpu", weights_only=False)
    assert "batches" in raw["CIFAR10DataModule"] and "images" not in raw["CIFAR10DataModule"]
    data = ["--data.root", str(make_fake_cifar(tmp_path, 20, 40, 0)), "--data.val_size", "20", "--data.num_workers",
            "0", "--trainer.logger", "false", *QUIET]
    arch = ["--model.arch.dim", "16", "--model.arch.depth", "1", "--model.arch.heads", "2", "--model.arch.patch_size",
            "8", "--model.arch.mlp_ratio", "2"]
    for batch in ("20", "40"):
        assert train_here(tmp_path, None, "--ckpt_path", str(OLD), *data, *arch, "--data.batch_size", batch,
                          "--trainer.max_epochs", "2") == 2
        assert errors_of(capsys) == [
            f"error: {OLD}: written by an earlier version, which did not record its training clock or its place in "
            "the data in images, so no run continues it exactly: test, classify, roll out or export it, or start a "
            "new run"]
    assert not list(tmp_path.glob("runs/smoke/*/checkpoints/*.ckpt"))  # nothing trained
    assert train_here(tmp_path, None, "test", "--ckpt_path", str(OLD), *data) == 0


def test_a_resume_keeps_cifars_split_in_any_words_and_refuses_another_before_any_work(tmp_path, fake_cifar_session,
                                                                                       capsys):
    """The run held out 100 of its 500 training images (--data.val_size 0.2): resumed with the count it means, it
    trains on. Another --data.val_size or --data.seed would draw other validation images off the training images,
    some of which the run trained on: refused in one line (exit 2) before any work: W&B (offline here) starts no
    run in the run folder."""
    assert train_here(tmp_path, fake_cifar_session, *TINY, "--data.val_size", "0.2", "--trainer.max_epochs", "1") == 0
    run = tmp_path / "runs/smoke/version_0"
    last = run / "checkpoints/last.ckpt"
    before = load(last)
    assert before["CIFAR10DataModule"]["split"] == {"val_size": 0.2, "seed": 0, "images": 500}
    capsys.readouterr()
    at = TINY.index("--trainer.logger")
    logged = [*TINY[:at], *TINY[at + 2:]]  # (the recipe's loggers, W&B among them)
    for other, line in (("--data.val_size 90", "--data.val_size 90 --data.seed 0"),
                        ("--data.seed 1", "--data.val_size 100 --data.seed 1")):
        assert train_here(tmp_path, fake_cifar_session, *logged, "--data.val_size", "100", *other.split(),
                          "--ckpt_path", "last", wandb="offline") == 2
        assert errors_of(capsys) == [
            f"error: {last.relative_to(tmp_path)}: the run held out 100 of 500 images for validation with "
            f"--data.val_size 0.2 --data.seed 0, and this command has {line}, which would hold out others, some of "
            f"them trained on: resume with --data.val_size 0.2 (or 100) --data.seed 0, or start a new run"]
        assert not (run / "wandb").exists() and load(last)["global_step"] == before["global_step"]
    assert train_here(tmp_path, fake_cifar_session, *TINY, "--data.val_size", "100", "--ckpt_path", "last") == 0
    after = load(last)
    assert after["epoch"] == 1 and after["global_step"] == 2 * before["global_step"] > 0


def test_a_split_that_records_no_image_count_is_kept_as_written():
    """A checkpoint of an earlier version recorded --data.val_size as given, without the images it split: the
    same words resume it, other words are refused (what they mean cannot be told)."""
    from vit.models.checkpoints import check_split

    ckpt = {"CIFAR10DataModule": {"split": {"val_size": 0.2, "seed": 0}}}
    data = {"class_path": "vit.data.CIFAR10DataModule", "root": "data", "val_size": 0.2, "seed": 0}
    check_split(ckpt, data, "c.ckpt")
    check_split(ckpt, {**data, "val_size": 100}, "c.ckpt", testing=True)  # (a test reads the test files alone)
    with pytest.raises(ConfigError, match=r"^c.ckpt: the run held out its validation images with "
                                          r"--data.val_size 0.2 --data.seed 0, and this command has --data.val_size "
                                          r"100 --data.seed 0, .*: resume with --data.val_size 0.2 --data.seed 0, or"):
        check_split(ckpt, {**data, "val_size": 100}, "c.ckpt")
