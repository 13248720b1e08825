"""A record keeps how it was made: from a tree with uncommitted changes, their diff beside it, named in it."""

import json
import subprocess
import sys
from pathlib import Path

from vit import plans
from vit.training import commits, results


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout


def checkout(path: Path) -> Path:
    """A git repository with one commit: code.py, a record under results/, the pages (README.md, docs/) and a
    .gitignore that ignores run folders and a job's log, as this repository's does."""
    path.mkdir()
    git(path, "init", "-q")
    (path / "code.py").write_text("lr = 1\n")
    (path / "results").mkdir()
    (path / "results" / "old.json").write_text("{}\n")
    (path / "docs").mkdir()
    (path / "docs" / "results.md").write_text("| a table |\n")
    (path / "README.md").write_text("# vit\n")
    (path / ".gitignore").write_text("/runs/\nslurm-*.out\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "first")
    return path


def test_a_record_of_a_dirty_tree_keeps_its_diff_and_one_of_a_clean_tree_none(tmp_path, monkeypatch):
    repo = checkout(tmp_path / "repo")
    sha = git(repo, "rev-parse", "HEAD").strip()
    monkeypatch.setattr(commits, "this_tree", lambda: commits.tree(repo))
    clean = tmp_path / "clean"
    clean.mkdir()
    (repo / "results" / "new.json").write_text("{}\n")  # records, pages and ignored files: the tree is clean
    (repo / "docs" / "results.md").write_text("| a table, rendered again |\n")
    (repo / "README.md").write_text("# vit, edited\n")
    (repo / "slurm-1.out").write_text("a job's log\n")
    (repo / "runs").mkdir()
    (repo / "runs" / "scratch.py").write_text("x = 1\n")
    assert commits.commit() == {"commit": sha, "dirty": False}
    results.write(clean, {"recipe": "cpu", **commits.commit()})
    assert sorted(p.name for p in clean.iterdir()) == ["results.json"]
    assert "diff" not in json.loads((clean / "results.json").read_text())

    (repo / "code.py").write_text("lr = 2\n")
    (repo / "results" / "old.json").write_text('{"changed": 1}\n')
    dirty = tmp_path / "dirty"
    dirty.mkdir()
    results.write(dirty, {"recipe": "cpu", **commits.commit()}, tested="last")
    record = json.loads((dirty / "results-last.json").read_text())
    assert record["dirty"] is True and record["diff"] == "results-last.diff"
    diff = (dirty / "results-last.diff").read_text()
    assert sha in diff and "+lr = 2" in diff and "results/old.json" not in diff  # the code's changes, not the records'
    assert "slurm-1.out" not in diff and "scratch.py" not in diff  # nor what .gitignore ignores
    changes = commits.code()["changes"]
    (repo / "slurm-2.out").write_text("another job's log\n")  # ignored: the same code, the same changes
    assert changes and commits.code()["changes"] == changes
    (repo / "code.py").write_text("lr = 3\n")
    assert commits.code()["changes"] not in (None, changes)
    (repo / "code.py").write_text("lr = 2\n")
    assert "README.md" not in diff and "docs/results.md" not in diff  # nor the pages'
    copy = tmp_path / "copy"  # the diff, applied to a checkout of the commit, gives the tree that made the record
    git(tmp_path, "clone", "-q", str(repo), str(copy))
    git(copy, "apply", str(dirty / "results-last.diff"))
    assert (copy / "code.py").read_text() == "lr = 2\n"
    again = {**record, "dirty": True}  # a record that names its diff already (a benchmark's later command) keeps it
    results.keep_diff(dirty / "results-last.json", again)
    assert again["diff"] == "results-last.diff"


def test_a_file_git_does_not_track_is_a_change_its_record_is_dirty_and_its_diff_holds_it(tmp_path, monkeypatch):
    """A new module (or recipe) that git does not track, in a tree whose tracked files are the commit's: the
    record is dirty (what commands write into the clone, an export or figures, is not code and leaves it clean), its diff holds the new file whole (`git apply` makes it in a checkout of the commit), its
    digest changes with the file's contents, and the user's index is left as it was (nothing staged)."""
    repo = checkout(tmp_path / "repo")
    monkeypatch.setattr(commits, "this_tree", lambda: commits.tree(repo))
    (repo / "model.onnx").write_bytes(bytes(range(256)))  # what commands write into the clone: not code
    (repo / "figures").mkdir()
    (repo / "figures" / "cat.png").write_bytes(bytes(range(256)))
    (repo / "nohup.out").write_text("a log\n")
    assert commits.tree(repo)[0]["dirty"] is False
    (repo / "vit").mkdir()
    (repo / "vit" / "new_module.py").write_text("def f():\n    return 1\n")
    (repo / "my_recipe.yaml").write_text("seed_everything: 1\n")  # code wherever it is: a recipe, a module
    index = git(repo, "ls-files", "--stage")
    run = tmp_path / "run"
    run.mkdir()
    results.write(run, {"recipe": "cpu", **commits.commit()})
    record = json.loads((run / "results.json").read_text())
    assert record["dirty"] is True and record["diff"] == "results.diff"
    diff = (run / "results.diff").read_text(errors="replace")
    assert "diff --git a/vit/new_module.py b/vit/new_module.py\nnew file mode 100644" in diff
    assert "+def f():\n+    return 1\n" in diff and "diff --git a/my_recipe.yaml b/my_recipe.yaml" in diff
    assert "model.onnx" not in diff and "cat.png" not in diff and "nohup.out" not in diff
    assert git(repo, "ls-files", "--stage") == index and git(repo, "status", "--porcelain") == \
        "?? figures/\n?? model.onnx\n?? my_recipe.yaml\n?? nohup.out\n?? vit/\n"  # the user's index: as it was
    copy = tmp_path / "copy"
    git(tmp_path, "clone", "-q", str(repo), str(copy))
    git(copy, "apply", str(run / "results.diff"))
    assert (copy / "vit" / "new_module.py").read_text() == "def f():\n    return 1\n"
    assert (copy / "my_recipe.yaml").read_text() == "seed_everything: 1\n"
    changes = commits.code()["changes"]
    (repo / "vit" / "new_module.py").write_text("def f():\n    return 2\n")
    assert commits.code()["changes"] not in (None, changes)


def test_the_record_of_the_tests_margins_keeps_its_diff_too(tmp_path, monkeypatch):
    """tests/learned.py's record (results/test-margins/learned.json) from a tree with uncommitted changes names
    their diff beside it, as every other record does (its trainings replaced by stand-ins here)."""
    import learned

    repo = checkout(tmp_path / "repo")
    (repo / "code.py").write_text("lr = 3\n")
    monkeypatch.setattr(commits, "this_tree", lambda: commits.tree(repo))
    monkeypatch.setattr(learned, "rollout_figures", lambda seed: {"accuracy": 1.0, "rollout": 0.5})
    monkeypatch.setattr(learned, "steps_to_fit_random_labels", lambda seed: 20)
    output = tmp_path / "margins" / "learned.json"
    monkeypatch.setattr(sys, "argv", ["learned.py", "--seeds", "2", "--output", str(output)])
    learned.main()
    record = json.loads(output.read_text())
    assert record["dirty"] is True and record["diff"] == "learned.diff"
    assert "+lr = 3" in (output.parent / "learned.diff").read_text()


def test_a_run_resumed_or_tested_on_other_code_names_that_code_in_its_record_and_its_tables_mark_it(
        tmp_path, monkeypatch, capsys, fake_cifar_session):
    """A run trained an epoch at one commit, then resumed for another on another commit with uncommitted changes:
    its record names the first command's code (``other_code``), and a table marks it § with a note saying which;
    the record of a run of one commit names none. Tested on a third commit, the test's record names both. A
    checkpoint whose list of code is crafted resumes, and the commands it does not tell are "not known"."""
    import torch

    from helpers import errors_of, train_here
    from vit.reporting.tables import Notes

    first, second, third = {"commit": "a" * 40, "dirty": False}, {"commit": "b" * 40, "dirty": True}, \
        {"commit": "c" * 40, "dirty": False}
    small = ["--model.arch.dim", "32", "--model.arch.depth", "1", "--model.arch.heads", "2", "--trainer.logger", "false"]
    monkeypatch.setattr(commits, "this_tree", lambda: (first, None))
    assert train_here(tmp_path, fake_cifar_session, "--trainer.max_epochs", "1", *small) == 0
    run = tmp_path / "runs/smoke/version_0"
    assert "other_code" not in json.loads((run / "results.json").read_text())
    monkeypatch.setattr(commits, "this_tree", lambda: (second, b"the changes"))
    assert train_here(tmp_path, fake_cifar_session, "--trainer.max_epochs", "2", "--ckpt_path", "last", *small) == 0
    record = json.loads((run / "results.json").read_text())
    assert (record["commit"], record["dirty"], record["commands"]) == ("b" * 40, True, 2)
    assert record["other_code"] == [{"commit": "a" * 40, "dirty": False, "changes": None, "commands": 1}]
    notes = Notes(tmp_path)
    assert notes.made(run / "results.json", record) == "†§"
    assert ("§ [results](runs/smoke/version_0/results.json): commands of other code than its record's commit trained "
            "the run: `aaaaaaa` (1 command).") in notes.lines()

    monkeypatch.setattr(commits, "this_tree", lambda: (third, None))
    last = run / "checkpoints/last.ckpt"
    assert train_here(tmp_path, fake_cifar_session, "test", "--ckpt_path", str(last), *small) == 0
    tested = json.loads((run / "results-last.json").read_text())
    assert [(o["commit"][:1], o["dirty"], o["commands"]) for o in tested["other_code"]] == [("a", False, 1),
                                                                                           ("b", True, 1)]
    notes = Notes(tmp_path)
    assert notes.made(run / "results-last.json", tested) == "§"
    assert "`aaaaaaa` (1 command), `bbbbbbb` with uncommitted changes (1 command)." in notes.lines()[-1]

    ckpt = torch.load(last, weights_only=True)
    clock = next(k for k in ckpt["callbacks"] if k.startswith("TrainingClock"))
    ckpt["callbacks"][clock]["trees"] = [1, {"commit": ["x"]}]  # crafted
    torch.save(ckpt, last)
    monkeypatch.setattr(commits, "this_tree", lambda: (second, b"other changes"))
    assert train_here(tmp_path, fake_cifar_session, "--trainer.max_epochs", "3", "--ckpt_path", "last", *small) == 0
    record = json.loads((run / "results.json").read_text())
    assert [(o["commit"], o["commands"]) for o in record["other_code"]] == [("not known", 2)]
    notes = Notes(tmp_path)
    notes.made(run / "results.json", record)
    assert "code that its checkpoint does not tell (2 commands)." in notes.lines()[-1]

    ckpt = torch.load(last, weights_only=True)
    ckpt["callbacks"][clock]["commands"] = "3"  # edited: refused in one line before any work, resumed or tested
    torch.save(ckpt, last)
    resumed = "runs/smoke/version_0/checkpoints/last.ckpt"
    for command in (["--trainer.max_epochs", "4", "--ckpt_path", "last"], ["test", "--ckpt_path", str(last)]):
        capsys.readouterr()
        assert train_here(tmp_path, fake_cifar_session, *command, *small) == 2
        then = "test another checkpoint" if command[0] == "test" else \
            "resume from another checkpoint of the run, or start a new run"
        assert errors_of(capsys) == [f"error: {last if command[0] == 'test' else resumed}: not as this program "
                                     f"writes it (callbacks.{clock}.commands '3'): {then}"]
    assert sorted(p.name for p in (tmp_path / "runs/smoke").iterdir()) == ["version_0"]  # (no folder left)


def test_a_checkpoint_field_not_as_written_is_refused_in_one_line_and_one_as_written_is_not():
    """vit.models.checkpoints.check_fields: what this program writes passes (a field an earlier version did not
    write may be missing; images/s may be None); an edited or crafted field is refused, all of them in one line
    naming each, and so is a level the table goes into that is not a dict."""
    import copy

    import pytest
    import torch

    from vit.data.resume import rng_states
    from vit.exits import CheckpointError
    from vit.models.checkpoints import EARLIER, PROGRESS, check_fields

    clock = {"training_seconds": 12.5, "train_images": 400, "steps": 8, "epochs": 1.0, "commands": 2,
             "train_images_per_second": None, "wall_seconds": 30.1, "validation_seconds": 0.0,
             "first_batches_seconds": 1.2, "trees": "anything: read leniently"}
    held_out = {"seed": 0, "val_size": 4, "classes": ["blue", "red"], "limits": [-5, None], "images": 20}
    written = {"callbacks": {"TrainingClock": clock, "TimeToAccuracy": {"reached": {"0.5": 3.0}, "reached_wall": {}},
                             "StopOnNonFinite": {"last_finite_loss": float("nan")},
                             "RNGStates": {"epoch": 1, "batches": 3, "states": [rng_states(), rng_states()]}},
               "loops": {"fit_loop": {"epoch_loop.batch_progress": {
                   "total": {"ready": 7, "started": 7, "processed": 7, "completed": 7},
                   "current": {"ready": 3, "started": 3, "processed": 3, "completed": 3}, "is_last_batch": False}}},
               "schedule": {"warmup_end_time": None, "share": 0.25}, "global_step": 8,
               "hyper_parameters": {"arch": {"dim": 64}, "_removed": {"decay": "linear"}},
               "vit": {"class_names": ["blue", "red"], "launch": None, "wandb_run_id": "abc123"},
               "ImageFolderDataModule": {"train_epochs": 2, "epoch": 1, "images": 96, "skipped_images": 0,
                                         "batch_images": 32, "step_images": 32, "epoch_end": False,
                                         "train_images": 16, "held_out": held_out}}
    check_fields(written, "x.ckpt", "ImageFolderDataModule")
    for split in ("val/", EARLIER, {k: v for k, v in held_out.items() if k != "images"}):  # (an earlier version's)
        check_fields({**written, "ImageFolderDataModule": {"held_out": split}}, "x.ckpt", "ImageFolderDataModule")
    check_fields({"callbacks": {"TrainingClock": {"train_images": 400, "steps": 8}}}, "x.ckpt", "")  # an older one's
    check_fields({"vit": {"warmup_end_time": 3.5, "run_share": 0.5}, "callbacks": {"TrainingClock": {}}}, "x.ckpt", "")
    check_fields({}, "x.ckpt", "CIFAR10DataModule", testing=True)
    check_fields({"callbacks": {"TrainingClockLogger": {"epochs": "every"}}}, "x.ckpt", "", testing=True)  # (another's)
    earlier = "x.ckpt: written by an earlier version, which did not record its training clock or its place in"
    for ckpt in ({"callbacks": None}, {"callbacks": {"TrainingClock": clock},  # (a position in loader batches)
                                       "CIFAR10DataModule": {"train_epochs": 1, "epoch": 0, "batches": 3}}):
        with pytest.raises(CheckpointError, match=f"^{earlier}"):
            check_fields(ckpt, "x.ckpt", "CIFAR10DataModule")  # to resume: refused
    check_fields({"callbacks": {"TrainingClock": clock}, "MyData": {"cursor": 5}}, "x.ckpt", "MyData")  # a user's

    def refused(path: str | tuple, value, testing: bool = False) -> str:
        """``written`` with the field at ``path`` (its keys, or dotted where they have no dots) set to ``value``."""
        *levels, key = path if isinstance(path, tuple) else path.split(".")
        ckpt = copy.deepcopy(written)
        level = ckpt
        for step in levels:
            level = level[step]
        level[key] = value
        with pytest.raises(CheckpointError) as refused:
            check_fields(ckpt, "x.ckpt", "ImageFolderDataModule", testing)
        return str(refused.value)

    then = "resume from another checkpoint of the run, or start a new run"
    held = {**held_out, "limits": ["0", None]}, {**held_out, "limits": [2 ** 63, 0]}, {**held_out, "val_size": -1}
    for path, value, shown in (
            ("callbacks.TrainingClock.commands", None, "None"), ("callbacks.TrainingClock.commands", 2.5, "2.5"),
            ("callbacks.TrainingClock.steps", 10 ** 400, "a number past 2**63"),
            ("callbacks.TrainingClock.train_images", True, "True"),
            ("callbacks.TrainingClock.training_seconds", None, "None"),
            ("callbacks.TrainingClock.epochs", float("nan"), "nan"),
            ("callbacks.TrainingClock.wall_seconds", -1.0, "-1.0"),
            ("callbacks.TrainingClock.validation_seconds", float("inf"), "inf"),
            ("callbacks.TrainingClock.first_batches_seconds", "1", "'1'"),
            ("callbacks.TrainingClock.train_images_per_second", -3.0, "-3.0"),
            ("callbacks.TimeToAccuracy.reached", {"abc": 1.0}, "{'abc': 1.0}"),
            ("callbacks.TimeToAccuracy.reached_wall", {"0.5": None}, "{'0.5': None}"),
            ("callbacks.StopOnNonFinite.last_finite_loss", "x", "'x'"),
            ("callbacks.RNGStates", [1], "[1]"), ("callbacks.RNGStates.epoch", "1", "'1'"),
            ("callbacks.RNGStates.batches", -1, "-1"), ("callbacks.RNGStates.states", [{"torch": 1}], "[{'torch': 1}]"),
            ((*PROGRESS, "current"), {"processed": -1}, "{'processed': -1}"),
            ((*PROGRESS, "total"), {"processed": "7"}, "{'processed': '7'}"), ((*PROGRESS, "is_last_batch"), 0, "0"),
            ("schedule.share", "x", "'x'"), ("schedule.share", 1.5, "1.5"), ("schedule.warmup_end_time", "1", "'1'"),
            ("vit", "x", "'x'"), ("vit.class_names", ["a", 2], "['a', 2]"), ("vit.launch", 3, "3"),
            ("vit.wandb_run_id", 7, "7"), ("vit.run_share", 2.0, "2.0"), ("vit.warmup_end_time", "x", "'x'"),
            ("global_step", "8", "'8'"), ("hyper_parameters", [1], "[1]"), ("hyper_parameters.arch", 3, "3"),
            ("hyper_parameters._removed", {"lr": 1}, "{'lr': 1}"),
            ("ImageFolderDataModule.images", -4, "-4"), ("ImageFolderDataModule.train_epochs", -1, "-1"),
            ("ImageFolderDataModule.epoch", 0.5, "0.5"), ("ImageFolderDataModule.skipped_images", None, "None"),
            ("ImageFolderDataModule.batch_images", "32", "'32'"),
            ("ImageFolderDataModule.step_images", 2 ** 63, "a number past 2**63"),
            ("ImageFolderDataModule.train_images", [], "[]"), ("ImageFolderDataModule.epoch_end", 1, "1"),
            *(("ImageFolderDataModule.held_out", crafted, repr(crafted)[:40]) for crafted in held),
            ("ImageFolderDataModule.held_out", "val", "'val'"), ("ImageFolderDataModule.held_out", 7, "7")):
        keys = path if isinstance(path, tuple) else tuple(path.split("."))
        assert refused(keys, value) == f"x.ckpt: not as this program writes it ({'.'.join(keys)} {shown}): {then}", keys
    data = "ImageFolderDataModule.split"  # (CIFAR-10's split, under its data module's key)
    assert refused(data, {"val_size": float("nan"), "seed": "0", "images": -1}) == (
        f"x.ckpt: not as this program writes it ({data}.val_size nan, {data}.seed '0', {data}.images -1): {then}")
    assert refused("callbacks", [1], testing=True) == ("x.ckpt: not as this program writes it (callbacks [1]): test "
                                                       "another checkpoint")  # (to resume: an earlier version's)
    rng = rng_states()
    for part, crafted in (("torch", torch.zeros(5056, dtype=torch.uint8)), ("numpy", {**rng["numpy"], "pos": 625}),
                          ("numpy", {**rng["numpy"], "has_gauss": torch.zeros(2)}), ("cuda", torch.zeros(16)),
                          ("cuda", torch.zeros(3, dtype=torch.uint8)),
                          ("python", {**rng["python"], "internal": torch.zeros(625, dtype=torch.int64) - 1})):
        states = [{**rng, part: crafted}]  # (what torch, numpy (past its key at pos 625) or random would not set)
        assert refused("callbacks.RNGStates.states", states).startswith("x.ckpt: not as this program writes it "
                                                                        "(callbacks.RNGStates.states [{"), part
    position = {k: v for k, v in written["ImageFolderDataModule"].items() if k not in ("epoch", "skipped_images")}
    rng_alone = {"states": written["callbacks"]["RNGStates"]["states"]}
    for where, part, missing in (("ImageFolderDataModule", position, "epoch missing, {}.skipped_images missing"),
                                 ("callbacks.RNGStates", rng_alone, "epoch missing, {}.batches missing"),
                                 ("callbacks.RNGStates", {"epoch": 0}, "batches missing, {}.states missing")):
        *levels, key = where.split(".")
        ckpt = copy.deepcopy(written)
        (ckpt[levels[0]] if levels else ckpt)[key] = part
        with pytest.raises(CheckpointError) as alone:  # (written together: one of them alone is not as written)
            check_fields(ckpt, "x.ckpt", "ImageFolderDataModule")
        assert str(alone.value) == f"x.ckpt: not as this program writes it ({where}.{missing.format(where)}): {then}"
    ckpt = {**written, "schedule": {"share": "x", "warmup_end_time": -1},
            "loops": {"fit_loop": {"epoch_loop.batch_progress": 5}}}
    with pytest.raises(CheckpointError) as every:
        check_fields(ckpt, "x.ckpt", "ImageFolderDataModule", testing=True)
    assert str(every.value) == ("x.ckpt: not as this program writes it (loops.fit_loop.epoch_loop.batch_progress 5, "
                                "schedule.warmup_end_time -1, schedule.share 'x'): test another checkpoint")


def test_the_digest_of_changes_is_the_same_whatever_the_users_git_settings(tmp_path, monkeypatch):
    repo = checkout(tmp_path / "repo")
    (repo / "code.py").write_text("lr = 2\n" + "".join(f"x{i} = {i}\n" for i in range(30)) + "y = 1\n")
    git(repo, "add", "code.py")
    git(repo, "commit", "-q", "-m", "longer")
    (repo / "code.py").write_text("lr = 3\n" + "".join(f"x{i} = {i}\n" for i in range(30)) + "y = 2\n")
    monkeypatch.setattr(commits, "this_tree", lambda: commits.tree(repo))
    changes = commits.code()["changes"]
    for setting in ("diff.algorithm=patience", "diff.context=10", "core.abbrev=12", "diff.interHunkContext=40",
                    "diff.noprefix=true", "diff.renames=copies", "color.diff=always"):
        git(repo, "config", *setting.split("="))
        assert commits.code()["changes"] == changes, setting


def test_other_code_counts_each_command_of_a_run_by_its_commit_and_changes():
    this = commits.code()
    same_commit_other_changes = {**this, "dirty": True, "changes": "0123456789abcdef"}
    assert results.other_code({"commands": 2, "trees": [this, this]}) == []
    assert results.other_code({"commands": 3, "trees": [same_commit_other_changes, this]}) == [
        {**same_commit_other_changes, "commands": 1}, {"commit": "not known", "dirty": None, "changes": None,
                                                       "commands": 1}]
    assert results.other_code({"commands": "x", "trees": "y"}) == []  # (crafted: nothing it can tell)
    assert results.other_code({"commands": 1, "trees": [same_commit_other_changes, this]}) == []  # (its last)
    assert results.other_code({"commands": 0, "trees": [same_commit_other_changes]}) == []
    from vit.reporting.tables import Notes

    notes, record = Notes(Path("/runs")), {"commit": "b" * 40, "dirty": True, "other_code": [
        {"commit": "b" * 40, "dirty": True, "changes": "0123456789abcdef", "commands": 2}]}
    assert notes.made(Path("/runs/x/results.json"), record) == "†§"
    assert notes.lines()[-1] == ("§ [results](x/results.json): commands of other code than its record's commit trained "
                                 "the run: `bbbbbbb` with other uncommitted changes (2 commands).")
    record["other_code"] = [{"commit": "b" * 40, "dirty": False, "commands": 1}, {"commit": "a" * 40, "dirty": None,
                                                                                 "commands": 1}]
    notes.made(Path("/runs/x/results.json"), record)
    assert notes.lines()[-1].endswith(": `bbbbbbb` without uncommitted changes (1 command), `aaaaaaa`, whether with "
                                      "uncommitted changes not known (1 command).")


def test_a_diff_in_any_encoding_under_any_git_configuration_applies_and_one_not_written_costs_no_record(
        tmp_path, monkeypatch, capsys):
    """Changes that are not UTF-8, with CRLF line ends, under a git configured for colour and without prefixes,
    give a diff that `git apply` takes; a diff that cannot be written (here a folder in its place) costs a
    warning line, never the record, which then names no diff (its tables say it was not kept)."""
    repo = checkout(tmp_path / "repo")
    git(repo, "config", "color.diff", "always")
    git(repo, "config", "diff.noprefix", "true")
    (repo / "code.py").write_bytes("lr = 2  # é\r\n".encode("latin-1"))
    monkeypatch.setattr(commits, "this_tree", lambda: commits.tree(repo))
    run = tmp_path / "run"
    run.mkdir()
    results.write(run, {"recipe": "cpu", **commits.commit()})
    copy = tmp_path / "copy"
    git(tmp_path, "clone", "-q", str(repo), str(copy))
    subprocess.run(["git", "-C", str(copy), "apply", str(run / "results.diff")], check=True, capture_output=True)
    assert (copy / "code.py").read_bytes() == (repo / "code.py").read_bytes()
    full = tmp_path / "full"
    (full / "results.diff").mkdir(parents=True)
    results.write(full, {"recipe": "cpu", **commits.commit()})
    record = json.loads((full / "results.json").read_text())
    assert record["dirty"] is True and "diff" not in record
    assert "warning: the diff of the uncommitted changes the record" in capsys.readouterr().err
    assert sorted(p.name for p in full.iterdir()) == ["results.diff", "results.json"]  # (no part left)


def test_a_plan_copies_a_records_diff_beside_its_copy(tmp_path):
    """make figures copies a run's record into results/TABLE/NAME.json: its diff goes to NAME.diff, named so."""
    job = plans.load(plans.find("cpu")).runs[1]
    runner = plans.Runner(tmp_path / "data", tmp_path / "runs", tmp_path / "results")
    run = tmp_path / "runs" / job.table / job.name
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"commit": "abc", "dirty": True, "diff": "results.diff"}))
    (run / "results.diff").write_text("diff --git a/x b/x\n")
    runner.collect(run / "results.json", job)
    copied = json.loads((tmp_path / "results" / job.table / f"{job.name}.json").read_text())
    assert copied["diff"] == f"{job.name}.diff" and copied["row"] == job.label
    assert (tmp_path / "results" / job.table / f"{job.name}.diff").read_text() == "diff --git a/x b/x\n"
    (run / "results.diff").unlink()  # a diff that is gone: the copy names none
    runner.collect(run / "results.json", job)
    assert "diff" not in json.loads((tmp_path / "results" / job.table / f"{job.name}.json").read_text())


def test_a_record_written_before_the_modules_moved_is_of_todays_plan():
    """A record's configuration names its classes by the paths of its day (``vit.callbacks.Throughput``); compared
    with today's (``vit.training.callbacks.Throughput``) it is the same run; another class is not."""
    recorded = {"trainer.callbacks": [{"class_path": "vit.callbacks.Throughput", "init_args": {"every": 5}}],
                "trainer.logger": {"class_path": "vit.loggers.WandbLogger"}, "data": "vit.data.CIFAR10DataModule"}
    today = {"trainer.callbacks": [{"class_path": "vit.training.callbacks.Throughput", "init_args": {"every": 5}}],
             "trainer.logger": {"class_path": "vit.training.loggers.WandbLogger"}, "data": "vit.data.CIFAR10DataModule"}
    assert results.differences({"configuration": recorded}, today) == []
    other = {**today, "trainer.logger": {"class_path": "vit.training.loggers.CSVLogger"}}
    assert [d.split(" ")[0] for d in results.differences({"configuration": recorded}, other)] == ["trainer.logger"]
