"""Reading checkpoints safely: ``torch.load(weights_only=True)`` (a crafted pickle cannot run code),
every failure turned into one CheckpointError that names the file and the reason. Light: torch only."""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import NamedTuple

from vit.exits import CheckpointError, ConfigError, DatasetError

__all__ = ["CheckpointError", "read_checkpoint", "upgrade"]

# The flat options of ViTClassifier before they were grouped (vit.training.module): old name → (group, field)
MOVED = {"optimizer": ("optimizer", "name"), "lr": ("optimizer", "lr"), "lr_batch_size": ("optimizer", "lr_batch_size"),
         "weight_decay": ("optimizer", "weight_decay"), "betas": ("optimizer", "betas"),
         "muon_lr": ("optimizer", "muon_lr"),
         "warmup_epochs": ("schedule", "warmup_epochs"), "min_lr": ("schedule", "min_lr"),
         "resize_stages": ("schedule", "resize_stages"),
         "label_smoothing": ("augmentation", "label_smoothing"), "mixup": ("augmentation", "mixup"),
         "cutmix": ("augmentation", "cutmix"), "mix_prob": ("augmentation", "mix_prob"),
         "random_erasing": ("augmentation", "random_erasing")}


class Removed(NamedTuple):
    """An option that left: the value that does what the code does now; what another value changed in a test
    or a resumed run (None: nothing there: the first weights, in the checkpoint's weights by now, or the
    rounding of Muon's update); why it left, for a command line or recipe that still names it."""

    same: object
    changed: str | None
    why: str


REMOVED = {
    "pos_init": Removed("normal", None, "the sine-cosine start of E_pos measured no gain over timm's (docs/results.md)"),
    "mimetic": Removed(None, None, "the mimetic initialisation lost at every scale measured (docs/results.md)"),
    "muon_ns_dtype": Removed("auto", None, "Muon's Newton–Schulz iteration runs in bfloat16 on a GPU and in float32 "
                                           "on a CPU"),
    "decay": Removed("cosine", "a resumed run would continue with the cosine",
                     "the linear decay measured no gain over the cosine (docs/results.md)"),
    "tta_flip": Removed(False, "validation and test would no longer average each image's and its mirror image's "
                               "logits (vit-classify --tta-flip still does)",
                        "averaging each image with its mirror image doubled validation's cost, and measured with "
                        "sin-cos E_pos and linear decay it lost 1.2 points (docs/results.md); vit-classify "
                        "--tta-flip still does it")}


def old_option(key: str, value=None) -> str | None:
    """What to say of a model option ``key`` with ``value`` (``--model.KEY``, or ``model: KEY:`` in a recipe) of an
    earlier version: where it is now, or why it left; None for an option of this version."""
    if key in REMOVED:
        return f"--model.{key} is no longer an option: {REMOVED[key].why}"
    if key in MOVED and (key != "optimizer" or value in ("adamw", "muon")):  # (today's is a group)
        group, field = MOVED[key]
        shown = f" {value}" if isinstance(value, (str, int, float)) and str(value) else ""
        return f"--model.{key}{shown} is --model.{group}.{field}{shown} now"
    return None


def todays_words(words: list[str]) -> tuple[list[str], list[str]]:
    """A command line of any version (its words) → the same settings under today's option names: each flat
    model option under its group (MOVED, as ``upgrade`` moves a checkpoint's), each option that left (REMOVED)
    dropped. Second, the options that left with a value that did something else than the code does now
    ("KEY VALUE"): what today's command line cannot say."""
    import yaml

    today, gone, i = [], [], 0
    while i < len(words):
        word = words[i]
        key, equals, value = word.removeprefix("--model.").partition("=")
        if not word.startswith("--model.") or (key not in REMOVED and key not in MOVED):
            today.append(word)
            i += 1
            continue
        if not equals:
            value = words[i + 1] if i + 1 < len(words) else ""
        i += 1 if equals else 2
        if key in REMOVED:
            try:
                same = yaml.safe_load(value) == REMOVED[key].same
            except yaml.YAMLError:
                same = False
            if not same:
                gone.append(f"{key} {value}")
        elif key == "optimizer" and value not in ("adamw", "muon"):  # (today's optimizer is a group)
            today += [word] if equals else [word, value]
        else:
            group, field = MOVED[key]
            today += [f"--model.{group}.{field}={value}"] if equals else [f"--model.{group}.{field}", value]
    return today, gone


def read_checkpoint(path: str | Path) -> dict:
    """A training checkpoint (.ckpt) as a dict, validated to hold a state_dict, its model's options as they
    are now (``upgrade``)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "global" not in str(e).lower():  # not a code reference: just bytes that are no checkpoint
            raise CheckpointError(f"{path}: not a readable checkpoint (corrupt pickle data)") from None
        detail = next((line.strip() for line in str(e).splitlines() if "global" in line.lower()), "")
        raise CheckpointError(f"{path}: refused, the checkpoint references code, not only weights and "
                              f"plain data ({detail})") from None
    except Exception as e:  # noqa: BLE001 - a corrupt file can fail anywhere in torch.load
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: "
                              f"{(str(e).splitlines() or [''])[0].split('. ')[0]})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise CheckpointError(f"{path}: not a vit training checkpoint (no state_dict)")
    if isinstance(ckpt.get("hyper_parameters"), dict):
        ckpt["hyper_parameters"] = upgrade(ckpt["hyper_parameters"])
    return ckpt


def upgrade(hparams: dict) -> dict:
    """The model's options as a checkpoint of any version stores them → as ViTClassifier takes them now.

    Flat options of earlier versions move into their group (MOVED). Options that left (REMOVED) are dropped;
    one whose value changed a resumed run or a test is kept under ``_removed`` (as every key of the stored
    options that is not one of the model's, it starts with "_") for ``refuse_removed``. Classify, rollout,
    export and the demo read none of it: the weights, classes and normalisation are the checkpoint's."""
    grouped: dict = {}
    for key, value in hparams.items():
        if key in REMOVED:
            if REMOVED[key].changed and value != REMOVED[key].same:
                grouped.setdefault("_removed", {})[key] = value
        elif key in MOVED and not isinstance(value, dict):  # (today's optimizer is a group: a dict)
            group, field = MOVED[key]
            grouped.setdefault(group, {})[field] = value
        else:
            grouped[key] = value
    return grouped


def refuse_removed(ckpt: dict, name: str | None, resume: bool) -> None:
    """A checkpoint written with an option that left and changed what a resumed run (``resume``) or a test
    would do: one line naming it, instead of a run that silently does otherwise."""
    removed = ckpt.get("hyper_parameters", {}).get("_removed", {})
    changed = [(k, v) for k, v in removed.items() if resume or k == "tta_flip"]  # (a test does no update)
    if changed:
        said = "; ".join(f"--model.{k} {str(v).lower() if isinstance(v, bool) else v}, which this version no longer "
                         f"has: {REMOVED[k].changed}" for k, v in changed)
        raise CheckpointError(f"{name or 'the last checkpoint'}: written with {said}. Classify, roll out or export "
                              f"it (its weights are read as before), or {'resume' if resume else 'test'} it with "
                              f"the version that wrote it")


def check_fits(ckpt: dict, arch: dict, name: str | None) -> None:
    """A checkpoint to resume whose model does not fit the command line's ``arch``, or that was written with an
    option that left and changed training (``refuse_removed``): one line naming the differences."""
    refuse_removed(ckpt, name, resume=True)
    theirs = ckpt.get("hyper_parameters", {}).get("arch", {})
    diff = [f"{k}: checkpoint {theirs[k]!r}, command line {arch[k]!r}" for k in arch
            if k in theirs and k != "num_classes" and theirs[k] != arch[k]]
    if diff:
        raise CheckpointError(f"{name or 'the last checkpoint'}: its model does not fit "
                              f"this command line ({'; '.join(diff)})")


CLOCK = "TrainingClock"  # the key of a run's training clock among a checkpoint's callbacks (its class's name)


def clock_state(ckpt: dict):
    """A checkpoint's training clock (vit.training.callbacks.TrainingClock) as stored: None without one."""
    callbacks = ckpt.get("callbacks")
    return callbacks.get(CLOCK) if isinstance(callbacks, dict) else None


# the whole numbers and the other figures the clock's state_dict writes (None only where it writes None: no
# images/s without seconds)
CLOCK_COUNTS = ("train_images", "steps", "commands")
CLOCK_FIGURES = ("training_seconds", "epochs", "wall_seconds", "validation_seconds", "first_batches_seconds")


def check_clock(ckpt: dict, name, testing: bool = False) -> None:
    """A checkpoint's training clock as TrainingClock writes it, or one line before any work (CheckpointError):
    an edited or crafted one would stop the run part way with a traceback, or its values would reach the record;
    a checkpoint to resume (not ``testing``) holds it and the data's position in images, or it is refused.
    A figure an earlier version did not write may be missing; its ``trees`` are read leniently (an entry not as
    vit.training.commits.code writes it is code not known)."""
    state = clock_state(ckpt)
    # (vit.data.resume.DataPosition's state, in a data module's: in loader batches before it was in images)
    in_batches = any(isinstance(v, dict) and "train_epochs" in v and "images" not in v for v in ckpt.values())
    if not testing and (state is None or in_batches):
        raise CheckpointError(f"{name}: written by an earlier version, which did not record its training clock or "
                              f"its place in the data in images, so no run continues it exactly: test, classify, "
                              f"roll out or export it, or start a new run")
    if state is None:
        return

    def fits(key: str) -> bool:
        value = state[key]
        if key == "train_images_per_second" and value is None:
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if key in CLOCK_COUNTS and not isinstance(value, int):
            return False
        return 0 <= value < 2 ** 63 if isinstance(value, int) else value >= 0 and math.isfinite(value)

    def shown(value) -> str:  # (a crafted whole number may have more digits than Python writes out)
        return "a number past 2**63" if isinstance(value, int) and value.bit_length() > 63 else repr(value)[:40]

    keys = (*CLOCK_COUNTS, *CLOCK_FIGURES, "train_images_per_second")
    bad = [key for key in keys if key in state and not fits(key)] if isinstance(state, dict) else []
    if not isinstance(state, dict) or bad:
        what = ", ".join(f"{key} {shown(state[key])}" for key in bad) if bad else f"a {type(state).__name__}"
        then = "test another checkpoint" if testing else "resume from another checkpoint of the run, or start a new run"
        raise CheckpointError(f"{name}: its training clock (TrainingClock) is not as this program writes it ({what}): "
                              f"{then}")


EARLIER = "drawn at each start"  # an image folder's split kept from an earlier version's checkpoint: drawn as then


def held_out_count(val_size: int | float, images: int) -> int:
    """The validation images ``--data.val_size`` holds out of ``images``: a count as given, a fraction's share (1 at
    least)."""
    return val_size if isinstance(val_size, int) else max(1, round(val_size * images))


def well_formed(held_out) -> bool:
    """Whether an image folder's ``held_out`` state is a drawn split as vit.data.datamodules.ImageFolderDataModule
    writes it (``images``: the images it was drawn over, which an earlier version did not record)."""
    keys = {"seed", "val_size", "classes", "limits"}
    return (isinstance(held_out, dict) and held_out.keys() in (keys, keys | {"images"})
            and isinstance(held_out["seed"], int) and isinstance(held_out["val_size"], (int, float))
            and isinstance(held_out.get("images", 1), int) and isinstance(held_out["classes"], list)
            and isinstance(held_out["limits"], list) and len(held_out["classes"]) == len(held_out["limits"])
            and all(isinstance(c, str) for c in held_out["classes"])
            and all(v is None or isinstance(v, int) and -2**63 <= v < 2**63 for v in held_out["limits"]))


def check_split(ckpt: dict, data: dict, name, testing: bool = False) -> None:
    """A resume (or a test of an image folder's held-out images) whose validation split is not the checkpoint's,
    refused in one line before any work (W&B, the folder's index, a device): it would validate on images the run
    trained on. ``data``: the command line's data module (``class_path`` and its arguments). The split the
    checkpoint records (its data module's state: CIFAR-10's ``split``, an image folder's ``held_out``) decides;
    a ``--data.val_size`` that holds out as many of the images it was drawn over (a fraction or the count it
    means) and the same ``--data.seed`` keep it. An image folder's split must also find the folder as it left
    it: the same class folders, and val/ where it validated on val/, none where it drew from train/."""
    state = ckpt.get(str(data.get("class_path", "")).rsplit(".", 1)[-1])
    state = state if isinstance(state, dict) else {}
    root = Path(str(data.get("root")))
    if "held_out" in state and not (testing and (root / "test").is_dir()):  # (a test/ folder: the split tests nothing)
        recorded = state["held_out"]
    elif isinstance(state.get("split"), dict) and not testing:  # (CIFAR-10's test reads the test files alone)
        recorded = state["split"]
    else:
        return
    if "held_out" in state:
        drawn, val = isinstance(recorded, dict), (root / "val").is_dir()
        train = root / "train"
        classes = sorted(d.name for d in train.iterdir() if d.is_dir()) if train.is_dir() else None
        if not (well_formed(recorded) if drawn else recorded in ("val/", EARLIER)):
            raise CheckpointError(f"{name}: its validation split (held_out) is not one this version wrote: "
                                  f"start a new run")
        if recorded == "val/" and not val:
            raise DatasetError(f"{name}: the run validated on {root / 'val'}, which is gone: put it back, or start a "
                               f"new run (without val/, the validation images come from train/, which the run "
                               f"trained on)")
        if drawn and val:
            raise DatasetError(f"{name}: the run drew its validation images from {train}, and {root / 'val'} now "
                               f"exists: remove val/ to resume, or start a new run")
        if drawn and classes is not None and recorded["classes"] != classes:
            raise DatasetError(f"{name}: the run's classes were {', '.join(recorded['classes'])}, and {train} now "
                               f"has {', '.join(classes)}: put the class folders back as they were, or start a new run")
        if not drawn:
            return
    theirs, seed, images = recorded.get("val_size"), recorded.get("seed"), recorded.get("images")
    ours = (data.get("val_size"), data.get("seed"))
    numbers = isinstance(images, int) and all(isinstance(v, (int, float)) for v in (theirs, ours[0]))
    if ours == (theirs, seed) or numbers and ours[1] == seed and \
            held_out_count(ours[0], images) == held_out_count(theirs, images):
        return
    count = held_out_count(theirs, images) if numbers else None
    what = f"{count:,} of {images:,} images for validation" if numbers else "its validation images"
    alike = f" (or {count})" if numbers and count != theirs else ""
    raise ConfigError(f"{name}: the run held out {what} with --data.val_size {theirs} --data.seed "
                      f"{seed}, and this command has --data.val_size {ours[0]} --data.seed {ours[1]}, which would "
                      f"hold out others, some of them trained on: resume with --data.val_size {theirs}{alike} "
                      f"--data.seed {seed}, or start a new run")
