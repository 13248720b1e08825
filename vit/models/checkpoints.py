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
    or a resumed run (None: nothing); why it left."""

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

CHANGED = {key for key, removed in REMOVED.items() if removed.changed}  # (what ``upgrade`` keeps under "_removed")


def old_option(key: str, value=None) -> str | None:
    """Where an earlier version's model option is now, or why it left; None for an option of this version."""
    if key in REMOVED:
        return f"--model.{key} is no longer an option: {REMOVED[key].why}"
    if key in MOVED and (key != "optimizer" or value in ("adamw", "muon")):  # (today's is a group)
        group, field = MOVED[key]
        shown = f" {value}" if isinstance(value, (str, int, float)) and str(value) else ""
        return f"--model.{key}{shown} is --model.{group}.{field}{shown} now"
    return None


def todays_words(words: list[str]) -> tuple[list[str], list[str]]:
    """A command line of any version under today's option names (MOVED grouped, REMOVED dropped), and the
    removed options whose value did something the code no longer does ("KEY VALUE")."""
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
    """A training checkpoint as a dict holding a state_dict, its model's options as they are now (``upgrade``)."""
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
    weights = ckpt.get("state_dict") if isinstance(ckpt, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in weights.items()):
        raise CheckpointError(f"{path}: not a vit training checkpoint (no state_dict of named tensors)")
    if "hyper_parameters" in ckpt:
        hparams = ckpt["hyper_parameters"]
        try:
            named = isinstance(hparams, dict) and plain(hparams, keys=(str,))
        except RecursionError:  # (nested deeper than Python's stack: no options of a model)
            named = False
        if not named:
            raise CheckpointError(f"{path}: not as this program writes it (hyper_parameters: not the model's "
                                  f"options, each named, in plain values)")
        ckpt["hyper_parameters"] = upgrade(hparams)
    return ckpt


def plain(value, keys: tuple = (str, int, float, bool)) -> bool:
    """Made of what YAML has too: None, bools, numbers, strings, and lists, tuples and dicts of them."""
    if isinstance(value, (list, tuple)):
        return all(plain(v, keys) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, keys) and plain(v, keys) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, float, str))


def upgrade(hparams: dict) -> dict:
    """A checkpoint's model options of any version, as ViTClassifier takes them now: flat ones grouped (MOVED),
    removed ones dropped, except one whose value changed what a resume or a test does, kept under ``_removed``
    for ``refuse_removed``."""
    grouped, moved, removed = {}, {}, {}
    for key, value in hparams.items():
        if key in REMOVED:
            if REMOVED[key].changed and value != REMOVED[key].same:
                removed[key] = value
        elif key in MOVED and not isinstance(value, dict):  # (today's optimizer is a group: a dict)
            group, field = MOVED[key]
            moved.setdefault(group, {})[field] = value
        else:
            grouped[key] = value
    for group, fields in moved.items():
        grouped[group] = {**fields, **grouped[group]} if isinstance(grouped.get(group), dict) else fields
    return {**grouped, "_removed": removed} if removed else grouped


def refuse_removed(ckpt: dict, name: str | None, resume: bool) -> None:
    """A checkpoint written with a removed option that changed what a resume or a test would do: one line."""
    hparams = ckpt.get("hyper_parameters")
    removed = hparams.get("_removed") if isinstance(hparams, dict) else None  # (another: check_fields names it)
    changed = [(k, v) for k, v in removed.items() if k in CHANGED and (resume or k == "tta_flip")] \
        if isinstance(removed, dict) else []  # (a test does no update)
    if changed:
        said = "; ".join(f"--model.{k} {str(v).lower() if isinstance(v, bool) else v}, which this version no longer "
                         f"has: {REMOVED[k].changed}" for k, v in changed)
        raise CheckpointError(f"{name or 'the last checkpoint'}: written with {said}. Classify, roll out or export "
                              f"it (its weights are read as before), or {'resume' if resume else 'test'} it with "
                              f"the version that wrote it")


def check_fits(ckpt: dict, arch: dict, name: str | None) -> None:
    """A checkpoint to resume whose model is not the command line's ``arch`` (EMA weights included): one line."""
    theirs = {**ckpt.get("hyper_parameters", {}).get("arch", {}),
              "ema": any(key.startswith("ema.") for key in ckpt["state_dict"])}
    named = {"ema": "EMA weights (--model.ema_decay)"}
    diff = [f"{named.get(k, k)}: checkpoint {theirs[k]!r}, command line {arch[k]!r}" for k in arch
            if k in theirs and k != "num_classes" and theirs[k] != arch[k]]
    if diff:
        raise CheckpointError(f"{name or 'the last checkpoint'}: its model does not fit "
                              f"this command line ({'; '.join(diff)})")


CLOCK = "TrainingClock"  # the key of a run's training clock among a checkpoint's callbacks (its class's name)


def clock_state(ckpt: dict):
    """A checkpoint's TrainingClock state, None without one."""
    callbacks = ckpt.get("callbacks")
    return callbacks.get(CLOCK) if isinstance(callbacks, dict) else None


EARLIER = "drawn at each start"  # an image folder's split kept from an earlier version's checkpoint: drawn as then


# --- what a field this program reads back must be (FIELDS): what the code that wrote it writes --------------------

def integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def whole(value) -> bool:
    """A count: a whole number ≥ 0 that torch's int64 holds."""
    return integer(value) and 0 <= value < 2 ** 63


def figure(value) -> bool:
    """A finite number ≥ 0 (seconds, epochs, a val_size)."""
    return whole(value) or isinstance(value, float) and math.isfinite(value) and value >= 0


def optional(check):
    return lambda value: value is None or check(value)


def share(value) -> bool:
    return figure(value) and value <= 1


def is_a(kind: type):
    return lambda value: isinstance(value, kind)


def texts(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def keyed(check, keys=is_a(str)):
    """A dict of values that ``check`` takes, under keys that ``keys`` takes."""
    return lambda value: isinstance(value, dict) and all(keys(k) and check(v) for k, v in value.items())


def accuracy(key) -> bool:
    """TimeToAccuracy's thresholds, floats written as str."""
    try:
        return isinstance(key, str) and math.isfinite(float(key))
    except ValueError:
        return False


def rng_states(value) -> bool:
    """RNGStates' states, one entry per process, each taken by torch, numpy and random as
    vit.data.resume.set_rng_states sets them (tried on new generators; the CUDA state, which a CPU cannot try, by
    its shape). numpy's ``pos`` is checked first: past its 624 words numpy would read past them."""
    import random

    import numpy as np
    import torch

    if not isinstance(value, list) or not value:
        return False
    try:
        for states in value:
            n, p, cuda = states["numpy"], states["python"], states["cuda"]
            if not (whole(n["pos"]) and n["pos"] <= 624 and optional(is_a(float))(p["gauss"])
                    and (cuda is None or isinstance(cuda, torch.Tensor) and cuda.dtype == torch.uint8
                         and cuda.shape == (16,))):  # (a CUDA generator's seed and offset)
                return False
            torch.Generator().set_state(states["torch"])
            np.random.RandomState().set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                                               n["has_gauss"], n["cached_gaussian"]))
            random.Random().setstate((p["version"], tuple(p["internal"].tolist()), p["gauss"]))
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError, OverflowError):
        return False
    return True


def validation_split(value) -> bool:
    """An image folder's split as ImageFolderDataModule writes it: "val/", EARLIER, or a drawn one (``images``:
    the images it was drawn over, which an earlier version did not record)."""
    keys = {"seed", "val_size", "classes", "limits"}
    if isinstance(value, str):
        return value in ("val/", EARLIER)
    return (isinstance(value, dict) and value.keys() in (keys, keys | {"images"}) and integer(value["seed"])
            and figure(value["val_size"]) and whole(value.get("images", 0)) and texts(value["classes"])
            and isinstance(value["limits"], list) and len(value["classes"]) == len(value["limits"])
            and all(v is None or integer(v) and -2 ** 63 <= v < 2 ** 63 for v in value["limits"]))


DATA = "<data module>"  # (in FIELDS: the command line's data module's key, its class's name: ``module_key``)
PROGRESS = ("loops", "fit_loop", "epoch_loop.batch_progress")  # (Lightning's: vit.private_api)

# Each field of a checkpoint this program reads back, by its path: what it must be (a crafted value would stop a
# run part way with a traceback, or reach the record). A field may be missing. The clock's ``trees`` are read
# leniently instead (vit.training.commits.code_of).
FIELDS = {
    **{("callbacks", CLOCK, key): whole for key in ("train_images", "steps", "commands")},
    **{("callbacks", CLOCK, key): figure for key in ("training_seconds", "epochs", "wall_seconds",
                                                      "validation_seconds", "first_batches_seconds")},
    ("callbacks", CLOCK, "train_images_per_second"): optional(figure),  # (None: no seconds yet)
    ("callbacks", "TimeToAccuracy", "reached"): keyed(figure, accuracy),
    ("callbacks", "TimeToAccuracy", "reached_wall"): keyed(figure, accuracy),
    ("callbacks", "StopOnNonFinite", "last_finite_loss"): is_a(float),  # (nan too: no finite loss yet)
    ("callbacks", "RNGStates", "epoch"): whole,
    ("callbacks", "RNGStates", "batches"): whole,
    ("callbacks", "RNGStates", "states"): rng_states,
    (*PROGRESS, "current"): keyed(whole),
    (*PROGRESS, "total"): keyed(whole),
    (*PROGRESS, "is_last_batch"): is_a(bool),
    ("schedule", "warmup_end_time"): optional(figure),
    ("schedule", "share"): share,
    ("vit", "warmup_end_time"): optional(figure),  # (the schedule's, before it had its own entry)
    ("vit", "run_share"): share,
    ("vit", "class_names"): texts,
    ("vit", "launch"): optional(is_a(str)),
    ("vit", "wandb_run_id"): optional(is_a(str)),
    ("vit", "command"): optional(is_a(str)),
    ("global_step",): whole,
    ("hyper_parameters", "arch"): is_a(dict),
    ("hyper_parameters", "_removed"): lambda value: isinstance(value, dict) and set(value) <= CHANGED,
    ("callbacks", "EpochSeed", "next_epoch"): whole,
    ("callbacks", "Timer", "time_elapsed"): keyed(figure),  # (Lightning's Timer's, kept by StepEndTimer)
    # the data's position (vit.data.resume.DataPosition) and its split (CIFAR-10's split, an image folder's held_out)
    **{(DATA, key): whole for key in ("train_epochs", "epoch", "images", "skipped_images", "batch_images",
                                      "step_images", "train_images")},
    (DATA, "epoch_end"): is_a(bool),
    (DATA, "held_out"): validation_split,
    (DATA, "split", "val_size"): figure,
    (DATA, "split", "seed"): integer,
    (DATA, "split", "images"): whole,
}


# fields written together: a checkpoint that has the first has the others too
TOGETHER = {(DATA, "images"): ("epoch", "skipped_images"),
            **{("callbacks", "RNGStates", key): ("epoch", "batches", "states") for key in ("epoch", "batches", "states")}}
MISSING = type("Missing", (), {"__repr__": lambda self: "missing"})()


def module_key(data: dict) -> str:
    """Where a checkpoint keeps the state of the data module ``data`` names: under its class's name."""
    return str(data.get("class_path", "")).rsplit(".", 1)[-1]


def shown(value) -> str:  # (a crafted whole number may have more digits than Python writes out)
    return "a number past 2**63" if integer(value) and value.bit_length() > 63 else repr(value)[:40]


def check_fields(ckpt: dict, name, data_key: str, testing: bool = False) -> None:
    """Every field of ``ckpt`` in FIELDS as this program writes it, or one CheckpointError naming those that are
    not. A checkpoint to resume must also hold the training clock and the data's position in images."""
    in_batches = any(isinstance(v, dict) and "train_epochs" in v and "images" not in v for v in ckpt.values())
    if not testing and (clock_state(ckpt) is None or in_batches):
        raise CheckpointError(f"{name}: written by an earlier version, which did not record its training clock or "
                              f"its place in the data in images, so no run continues it exactly: test, classify, "
                              f"roll out or export it, or start a new run")
    bad = {}  # path → value (a level that is not a dict is one entry, however many fields lie under it)
    for path, fits in FIELDS.items():
        level, walked = ckpt, ()
        for key in (data_key if step == DATA else step for step in path):
            if not isinstance(level, dict):
                bad[walked] = level
                break
            if key not in level:
                break
            level, walked = level[key], (*walked, key)
        else:
            if not fits(level):
                bad[walked] = level
    for (*path, field), keys in TOGETHER.items():
        path, level = [data_key if step == DATA else step for step in path], ckpt
        for key in path:
            level = level.get(key) if isinstance(level, dict) else None
        if isinstance(level, dict) and field in level:
            bad |= {(*path, key): MISSING for key in keys if key not in level}
    if bad:
        what = ", ".join(f"{'.'.join(path)} {shown(value)}" for path, value in bad.items())
        then = "test another checkpoint" if testing else "resume from another checkpoint of the run, or start a new run"
        raise CheckpointError(f"{name}: not as this program writes it ({what}): {then}")


def check_classes(ckpt: dict, num_classes: int, name) -> None:
    """A checkpoint used with data of another number of classes (its head would not fit): one line."""
    names = ckpt.get("vit", {}).get("class_names")  # (a list of texts: check_fields)
    if names is not None and len(names) != num_classes:
        raise DatasetError(f"{name}: its model classifies {len(names)} classes ({', '.join(names[:5])}"
                           f"{', ...' if len(names) > 5 else ''}), and the data of this command has {num_classes}: "
                           f"give it the data it was trained on, or start a new run")


def check_weights(module, path, ckpt: dict) -> None:
    """Weights that do not fit the model (crafted, or edited): one line before any work, not Lightning's traceback."""
    try:
        module.load_state_dict(ckpt["state_dict"])  # (strict, as Lightning loads it)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: its weights and its model's options do not fit together "
                              f"({' '.join(str(e).split())[:400]})") from None


def check_checkpoint(ckpt: dict, name, data: dict, arch: dict | None = None) -> None:
    """Everything vit-train reads of a checkpoint, checked before any work. ``arch`` None: to test, not resume."""
    testing = arch is None
    refuse_removed(ckpt, name, resume=not testing)  # (before check_fields: the line that says how to go on)
    check_fields(ckpt, name, module_key(data), testing)
    if not testing:
        check_fits(ckpt, arch, name)
    check_split(ckpt, data, name, testing)


def held_out_count(val_size: int | float, images: int) -> int:
    """The validation images ``--data.val_size`` (a count or a fraction) holds out of ``images``."""
    return val_size if isinstance(val_size, int) else max(1, round(val_size * images))


def check_split(ckpt: dict, data: dict, name, testing: bool = False) -> None:
    """A resume (or a test of an image folder's held-out images) whose validation split is not the checkpoint's:
    one line before any work, as it would validate on images the run trained on. The same ``--data.seed`` and a
    ``--data.val_size`` that holds out as many images (as a fraction or a count) keep the split; an image folder
    must also have the same class folders, and val/ exactly where the run validated on it."""
    state = ckpt.get(module_key(data)) or {}
    root = Path(str(data.get("root")))
    if "held_out" in state and not (testing and (root / "test").is_dir()):  # (a test/ folder: the split tests nothing)
        recorded = state["held_out"]
    elif "split" in state and not testing:  # (CIFAR-10's test reads the test files alone)
        recorded = state["split"]
    else:
        return
    if "held_out" in state:
        drawn, val = isinstance(recorded, dict), (root / "val").is_dir()
        train = root / "train"
        classes = sorted(d.name for d in train.iterdir() if d.is_dir()) if train.is_dir() else None
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
    numbers = None not in (images, theirs, ours[0])  # (an earlier version's split records no images)
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
