"""The package's shape: no module imports one that imports it back, and the launcher's environment
(SLURM's and torchrun's variables) is read in one module, vit/cluster/launch.py."""

import ast
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
           for f in (ROOT / "vit").rglob("*.py")}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vit":
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "vit"}
    return {m for m in found if m in MODULES}


def test_no_import_cycles():
    graph = {name: imports(path) - {name, "vit"} for name, path in MODULES.items()}

    def reaches(start: str, goal: str, seen: set) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

    cycles = sorted((a, b) for a in graph for b in graph[a] if reaches(b, a, {b}))
    assert not cycles, f"modules that import each other: {cycles}"


def test_the_launchers_environment_is_read_in_one_module():
    launcher = re.compile(r"SLURM_|TORCHELASTIC_|LOCAL_WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT|\bWORLD_SIZE")
    readers = sorted(name for name, path in MODULES.items() if launcher.search(path.read_text()))
    assert readers == ["vit.cluster.launch"]


def test_the_package_map_names_files_that_exist_and_define_what_it_says():
    """docs/development.md's map (question → file) names each module of the package, only files that exist, and each
    name a row gives in backticks (`run_callbacks`, `Schedule`) is defined at the top level of its files."""
    text = (ROOT / "docs" / "development.md").read_text()
    rows = list(itertools.takewhile(lambda line: line.startswith("|"),
                                    text[text.index("| question | file |"):].splitlines()[2:]))
    named = {path for row in rows for path in re.findall(r"`(vit/[\w/]+\.py)`", row)}
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert rows and named and not missing, f"docs/development.md's layout names files that do not exist: {missing}"
    modules = {f.relative_to(ROOT).as_posix() for f in (ROOT / "vit").rglob("*.py") if f.name != "__init__.py"
               and f.parent.name not in ("commands", "benchmark", "plans")}
    assert not modules - named, f"modules missing from docs/development.md's layout: {sorted(modules - named)}"
    for row in rows:
        answer = row.split("|")[2]
        defined = set().union(*(top_level_names(ROOT / p) for p in re.findall(r"`(vit/[\w/]+\.py)`", answer)))
        claimed = set(re.findall(r"`([A-Za-z_]\w*)`", answer))
        assert claimed <= defined, f"{answer.strip()}: {sorted(claimed - defined)} defined in none of its files"
    assert sum(bool(re.search(r"`[A-Za-z_]\w*`", row.split("|")[2])) for row in rows) >= 10


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names |= {t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                      if isinstance(t, ast.Name)}
    return names


def test_test_modules_share_through_helpers_only():
    """tests/helpers.py (and tests/learned.py, the trainings of learned-quality tests) hold what tests share;
    no test module imports another, nor conftest."""
    crossing = sorted(f"{path.relative_to(ROOT)}: {node.module}" for path in (ROOT / "tests").rglob("*.py")
                      for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, ast.ImportFrom) and node.module
                      and (node.module.startswith("test_") or node.module == "conftest"))
    assert not crossing, crossing


def test_every_test_marked_lowest_is_in_a_file_make_test_lowest_runs():
    """A long test marked `lowest` proves a lower bound only if make test-lowest collects its file (the whole
    file, or that test by its node id)."""
    makefile = (ROOT / "Makefile").read_text()
    listed = set(re.search(r"^LOWEST_TESTS \?=((?:.*\\\n)*.*)$", makefile, re.M).group(1).replace("\\\n", " ").split())
    listed = {entry.split("::")[0] for entry in listed}
    marked = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")
              if re.search(r"^@pytest\.mark\.lowest\b", path.read_text(), re.M)}
    assert marked and marked <= listed, marked - listed
    assert '-m "not long or lowest" $(LOWEST_TESTS)' in makefile


@pytest.mark.long
def test_importing_the_package_leaves_global_state_alone():
    """Warning filters, logging filters and PIL's settings are the program's: the commands set what they need
    when they run (vit.commands.train.quiet_third_party), no module of the package does on import."""
    modules = sorted(MODULES)
    code = ("import logging, warnings, PIL.Image as I, PIL.ImageFile as F\n"
            "import lightning, timm, torchvision, matplotlib, jsonargparse, torchmetrics, safetensors\n"
            "state = lambda: (len(warnings.filters), I.MAX_IMAGE_PIXELS, F.LOAD_TRUNCATED_IMAGES, sorted(\n"
            "    (n, len(l.filters)) for n, l in logging.Logger.manager.loggerDict.items() if isinstance(l, logging.Logger)))\n"
            "I.MAX_IMAGE_PIXELS, before = 1234, None\n"
            "before = state()\n"
            f"for m in {modules!r}:\n"
            "    __import__(m)\n"
            "after = state()\n"
            "assert after[:3] == before[:3] and {n: k for n, k in after[3] if k} == {n: k for n, k in before[3] if k}, "
            "(before[:3], after[:3])\n")
    python_ok(code)


def python_ok(code: str) -> None:
    """``code`` in a fresh Python process (nothing imported yet): it must end with exit 0."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_library_never_imports_a_command():
    """Commands (vit/commands/) sit on the library; no library module imports one (no import runs back up)."""
    upward = sorted(f"{name} imports {m}" for name, path in MODULES.items() if not name.startswith("vit.commands")
                    for m in imports(path) if m.startswith("vit.commands"))
    assert not upward, upward


def test_commands_without_a_model_start_without_torch_and_the_packages_names_still_import():
    """vit-plan, vit-sync and vit-figures (a table, a plan's show on a login node) do not import torch, Lightning
    or wandb when they start; `from vit import VisionTransformer` and the other public names load on use."""
    code = ("import sys\n"
            "import vit.commands.plan, vit.commands.sync, vit.commands.figures\n"
            "assert not {'torch', 'lightning', 'wandb'} & set(sys.modules), sorted({'torch', 'lightning', 'wandb'} & set(sys.modules))\n"
            "import vit\n"
            "from vit import VisionTransformer, attention_rollout, create_model\n"
            "assert VisionTransformer.__module__ == 'vit.models.model' and set(vit.__all__) <= set(dir(vit))\n"
            "try:\n"
            "    vit.no_such_name\n"
            "except AttributeError as e:\n"
            "    assert 'no_such_name' in str(e)\n"
            "else:\n"
            "    raise AssertionError('vit.no_such_name')\n")
    python_ok(code)


# The package's layers, lowest first: a module imports (at its top or inside a function) only from its own
# layer and the ones below, so that a lower job never reaches up into a higher one.
LAYERS = (
    ("vit.exits", "vit.private_api"),  # the error types and the ledger: nothing of the package
    ("vit.models",),     # the ViT, its preprocessing, checkpoints read back
    ("vit.cluster",),    # launchers, GPUs, the network, the disk, run folders
    ("vit.data",),       # datasets and batches (an image folder's mirror, a resumed run's position)
    ("vit.training",),   # the LightningModule and a run's machinery
    ("vit.inference",),  # a trained model in use
    ("vit.plans",),      # plans of runs and their records
    ("vit.reporting",),  # figures and tables from the records (a plan's table), uploads
    ("vit.benchmark",),  # speed figures of all of the above
    ("vit.failures",),   # which error ends a command how (a full disk, an out-of-memory)
    ("vit.commands",),   # the programs
)


def layer(module: str) -> int | None:
    return next((i for i, names in enumerate(LAYERS) for n in names if module == n or module.startswith(f"{n}.")),
                None)


def test_no_module_imports_from_a_higher_layer():
    unplaced = sorted(name for name in MODULES if name != "vit" and layer(name) is None)
    assert not unplaced, f"modules in no layer of LAYERS: {unplaced}"
    upward = sorted(f"{name} imports {m}" for name, path in MODULES.items() if name != "vit"
                    for m in imports(path) - {"vit"} if layer(m) > layer(name))
    assert not upward, upward
    assert layer("vit.cluster.runs") < layer("vit.training.module") < layer("vit.commands.train")


def test_the_package_and_its_tests_import_each_module_by_its_path():
    """Old module paths (vit.MOVED) are for recipes, records and users' code: ours name the modules where they are
    (an old path would hide an import from the layers above)."""
    import vit

    old = set(vit.MOVED)
    found = sorted(f"{path.relative_to(ROOT)}: {name}" for path in [*(ROOT / "vit").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
                   for node in ast.walk(ast.parse(path.read_text()))
                   for name in ([node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                                if isinstance(node, ast.ImportFrom) and node.module
                                else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                   if name in old)
    assert not found, found

def test_the_old_module_paths_are_the_moved_modules():
    """A module's path before the subpackages (vit.callbacks, vit.runs, `from vit import runs`) imports the very
    module of its new path (vit.MOVED), without importing torch where the module itself does not; vit.data and
    vit.inference give their modules' public classes under the old names."""
    code = ("import importlib, sys, vit\n"
            "import vit.runs, vit.results, vit.tables, vit.sync, vit.launch, vit.run_lock, vit.checkpoints, vit.folders\n"
            "from vit import storage, network, gpus\n"
            "import vit.data, vit.inference\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "import vit.cluster.runs, vit.cluster.storage\n"
            "assert vit.runs is vit.cluster.runs and storage is vit.cluster.storage\n"
            "assert vit.runs.__spec__.name == vit.runs.__name__ == 'vit.cluster.runs'\n"
            "assert sys.modules['vit.runs'] is sys.modules['vit.cluster.runs']\n"
            "assert len(vit.MOVED) >= 30 and 'vit.callbacks' in vit.MOVED\n"
            "for old, new in vit.MOVED.items():\n"
            "    assert importlib.import_module(old) is importlib.import_module(new), old\n"
            "from vit.callbacks import Throughput\n"
            "from vit.training.callbacks import Throughput as New\n"
            "from vit.data.datamodules import ImageFolderDataModule\n"
            "from vit.inference.classifier import load_classifier\n"
            "assert Throughput is New and vit.data.ImageFolderDataModule is ImageFolderDataModule\n"
            "assert vit.inference.load_classifier is load_classifier\n"
            "try:\n"
            "    import vit.no_such_module\n"
            "except ModuleNotFoundError:\n"
            "    pass\n"
            "else:\n"
            "    raise AssertionError('vit.no_such_module')\n")
    python_ok(code)


def test_command_lines_with_the_old_class_paths_parse_to_the_same_classes():
    """Records keep the commands as they ran (`--data vit.data.ImageFolderDataModule`, a callback or logger named
    by its module's old path): they still parse, to the classes of the new paths."""
    import importlib
    import subprocess
    import sys

    import yaml

    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "smoke",
                           "--data", "vit.data.ImageFolderDataModule", "--trainer.logger", "vit.loggers.CSVLogger",
                           "--trainer.callbacks+", "vit.callbacks.TimeToAccuracy", "--print_config"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = yaml.safe_load(proc.stdout)
    loggers = config["trainer"]["logger"]
    named = [config["data"]["class_path"], *(l["class_path"] for l in (loggers if isinstance(loggers, list) else [loggers])),
             *(c["class_path"] for c in config["trainer"]["callbacks"])]
    classes = [getattr(importlib.import_module(path.rpartition(".")[0]), path.rpartition(".")[2]) for path in named]
    from vit.data.datamodules import ImageFolderDataModule
    from vit.training.callbacks import Throughput, TimeToAccuracy
    from vit.training.loggers import CSVLogger

    assert classes[:2] == [ImageFolderDataModule, CSVLogger] and {Throughput, TimeToAccuracy} <= set(classes[2:])


def test_the_data_and_inference_packages_serve_the_names_of_the_modules_they_replace():
    """vit.data and vit.inference were modules: their names (vit.data.split_batch, vit.inference.sidecar) are still
    theirs, from the module they moved to, and the packages' own modules import as modules."""
    import vit.data
    import vit.inference
    from vit.data import datamodules
    from vit.inference import classifier

    assert vit.data.split_batch is datamodules.split_batch and vit.data.DatasetError is datamodules.DatasetError
    assert vit.inference.sidecar is classifier.sidecar
    from vit.data import cifar  # (a module of the package, not a name of datamodules)

    assert cifar.__name__ == "vit.data.cifar"
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        vit.data.no_such_name
