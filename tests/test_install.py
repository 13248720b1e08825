"""The package installed as a user gets it: a wheel, every console script, the recipes found by name from
any directory, no deprecation warnings of our own making."""

import contextlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def checkout_only(*also: str):
    """copytree's ignore: what building and running write (the venvs, runs/, data/ and build/ at the checkout's
    top: vit/data/ is the package's), caches, and ``also``."""
    everywhere = shutil.ignore_patterns(".git", ".venv*", "*.egg-info", "__pycache__", ".pytest_cache")

    def ignore(folder, names):
        top = {"runs", "data", "build", *also} if Path(folder) == ROOT else set()
        return set(everywhere(folder, names)) | (top & set(names))
    return ignore


def build_wheel(tmp_path: Path) -> Path:
    """The project's wheel, built (pip, no build isolation: nothing downloaded) from a copy of the checkout
    under ``tmp_path``: building writes build/ and *.egg-info beside the sources."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=checkout_only("docs"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    assert "Deprecat" not in build.stdout + build.stderr
    (wheel,) = (tmp_path / "dist").glob("vit_lightning-*.whl")  # the distribution; the import name stays vit
    return wheel


@pytest.mark.long
def test_wheel_carries_recipes_and_commands(tmp_path):
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert {"vit/configs/base.yaml", "vit/configs/smoke.yaml", "vit/configs/cpu.yaml", "vit/commands/train.py"} <= set(names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for command in ("vit-train", "vit-classify", "vit-rollout", "vit-export", "vit-benchmark", "vit-report", "vit-figures",
                    "vit-plan"):
        assert f"{command} = vit.commands." in entry_points
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    script = (target / "bin" / "vit-train").read_text()
    assert "from vit.commands.train import main" in script
    # run the installed package from another directory (this venv's editable install of the checkout is set
    # aside: its import hook would otherwise win over the target)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import sys; sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
            f"sys.path.insert(0, {str(target)!r}); import vit; assert vit.__file__.startswith({str(target)!r}); "
            "from vit.commands.train import main; sys.exit(main(['--config', 'smoke', '--help']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())
    assert "a recipe (cpu, finetune_cifar10, smoke, vit_cifar10, vit_cifar10_fast, vit_cifar10_lee, vit_tiny_cifar10)" in text
    assert "site/vit/configs/smoke.yaml" in text.replace(" ", "")  # found in the installed package
    assert list(elsewhere.iterdir()) == []


@pytest.mark.long
def test_every_command_of_the_installed_wheel_starts_outside_the_checkout(tmp_path):
    """`pip install .` (or git+URL) as a user gets it: the wheel holds every package under vit/ and every
    recipe, and in a venv of its own, away from the checkout, each console script of pyproject.toml answers
    --help (a package left out of the wheel ends in an ImportError here, not in a user's hands)."""
    import tomllib

    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {".".join(f.parent.relative_to(ROOT).parts) for f in (ROOT / "vit").rglob("__init__.py")}
    in_wheel = {n.removesuffix("/__init__.py").replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert in_wheel == packages | {"vit.configs"}, sorted(in_wheel ^ (packages | {"vit.configs"}))
    recipes = sorted(f.name for f in (ROOT / "configs").glob("*.yaml"))
    assert {f"vit/configs/{name}" for name in recipes} <= names, sorted(n for n in names if "configs" in n)

    # a venv of its own that sees this venv's packages (torch, lightning, ...) but not the project: a
    # folder of links to them, less vit-lightning's install (editable: its finder leads to the checkout)
    import torch

    site = Path(torch.__file__).parents[1]
    environment = tmp_path / "environment"
    environment.mkdir()
    for entry in site.iterdir():
        if entry.name != "vit" and not entry.name.lower().startswith(("vit_lightning", "__editable__", "_virtualenv")):
            (environment / entry.name).symlink_to(entry)
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    (next((venv / "lib").glob("python3*")) / "site-packages" / "environment.pth").write_text(f"{environment}\n")
    env = clean_env(PIP_NO_INDEX="1")  # nothing downloaded: --no-deps, and no index
    env.pop("PYTHONPATH", None)
    python = str(venv / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]

    elsewhere = tmp_path / "elsewhere"  # not the checkout, nor a folder holding it
    elsewhere.mkdir()
    where = subprocess.run([python, "-c", "import sys, vit, vit.configs; print(vit.__file__); "
                                          "print(vit.configs.__file__); print(' '.join(vit.configs.names())); "
                                          "print(sys.argv[1] in sys.path)", str(ROOT)],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    vit_at, configs_at, found, checkout_on_path = where.stdout.splitlines()
    assert vit_at.startswith(str(venv)) and configs_at.startswith(str(venv)), where.stdout
    assert sorted(found.split()) == sorted(n.removesuffix(".yaml") for n in recipes if n != "base.yaml"), found
    assert checkout_on_path == "False"

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"vit-train", "vit-plan", "vit-benchmark"} <= set(scripts), scripts
    failed = {}
    for command in scripts:
        proc = subprocess.run([str(venv / "bin" / command), "--help"], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=300)
        output = proc.stdout + proc.stderr
        if proc.returncode != 0 or "Traceback" in output or command not in proc.stdout:
            failed[command] = f"exit {proc.returncode}: {output[-1500:]}"
    assert not failed, "\n\n".join(f"{command} --help: {why}" for command, why in failed.items())
    assert list(elsewhere.iterdir()) == []


def clean_env(**extra: str) -> dict[str, str]:
    """This environment less pip's settings and any active venv, plus ``extra``."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))
           and k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # (make test's own: make's lines would differ)
    return {**env, "PIP_CONFIG_FILE": os.devnull, **extra}


@pytest.mark.long
def test_an_offline_node_installs_from_the_folder_make_wheels_fills_and_keeps_the_environments_torch(
        tmp_path, fake_cifar):
    """README's cluster install: `make wheels SYSTEM_SITE=1` on a machine with network (for this Python and
    platform, given explicitly), then `make install WHEELS=DIR SYSTEM_SITE=1` in a venv that sees an
    environment's packages (here: this venv's, as a cluster's torch module or container would provide them,
    less einops), with no index at all. The folder holds no torch; torch is reused, einops comes from the
    folder; `--config smoke` trains end to end."""
    import os
    import platform

    import torch

    wheels = tmp_path / "wheels"
    version = "%d.%d" % sys.version_info[:2]
    fill = subprocess.run(["make", "wheels", f"WHEELS={wheels}", "SYSTEM_SITE=1", f"PYTHON={sys.executable}",
                           f"TARGET_PYTHON={version}", f"TARGET_PLATFORM=manylinux_2_28_{platform.machine()}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if fill.returncode != 0 and "No matching distribution" not in fill.stderr and "Could not find" not in fill.stderr:
        pytest.skip(f"the package index is out of reach to fill the wheel folder: {fill.stderr[-300:]}")
    assert fill.returncode == 0, fill.stdout[-2000:] + fill.stderr[-3000:]
    assert f"packages for Python {version} on manylinux_2_28_{platform.machine()} in {wheels} (torch and " \
           "torchvision left out" in fill.stdout
    names = sorted(p.name for p in wheels.iterdir())
    assert all(n.endswith(".whl") for n in names), names  # binary only: nothing to build on the node
    lowered = [n.lower() for n in names]
    assert not [n for n in lowered if n.startswith(("torch-", "torchvision-", "triton-", "nvidia", "cuda"))], names
    for package in ("einops-", "lightning-", "timm-", "jsonargparse-", "wandb-", "setuptools-"):
        assert any(n.startswith(package) for n in lowered), (package, names)
    cp = f"cp{version.replace('.', '')}"
    assert all(f"-{cp}-" in n or "-py3-none-" in n or "-py2.py3-none-" in n or "-abi3-" in n for n in lowered), \
        [n for n in lowered if f"-{cp}-" not in n]

    site = Path(torch.__file__).parents[1]
    environment = tmp_path / "environment"  # the cluster's packages: this venv's, without einops and vit
    environment.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith(("einops", "vit_lightning", "__editable__", "_virtualenv")):
            (environment / entry.name).symlink_to(entry)
    venv, source = tmp_path / "venv", tmp_path / "src"
    subprocess.run([sys._base_executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    (next((venv / "lib").glob("python3*")) / "site-packages" / "environment.pth").write_text(f"{environment}\n")
    shutil.copytree(ROOT, source, ignore=checkout_only("docs", "wheels"))
    env = clean_env(PIP_NO_INDEX="1")  # no index, no find-links but the folder
    install = subprocess.run(["make", "install", f"VENV={venv}", f"WHEELS={wheels}", "SYSTEM_SITE=1"], cwd=source,
                             env=env, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    assert (venv / ".installed").read_text() == f"SYSTEM_SITE=1 WHEELS={wheels} TORCH=\n"
    python = str(venv / "bin" / "python")
    where = subprocess.run([python, "-c", "import torch, einops, vit; print(torch.__file__, einops.__file__, "
                                          "vit.__file__)"], cwd=tmp_path, capture_output=True, text=True, env=env,
                           timeout=120)
    torch_at, einops_at, vit_at = where.stdout.split()
    assert torch_at.startswith(str(environment)) and einops_at.startswith(str(venv)) and \
        vit_at.startswith(str(source)), where.stdout + where.stderr
    run = subprocess.run([python, str(source / "scripts" / "train.py"), "--config", "smoke", "--data.root", str(fake_cifar),
                          "--data.val_size", "100", "--data.num_workers", "0", "--data.batch_size", "50",
                          "--trainer.max_epochs", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**env, "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "test on 200 images" in run.stderr


@pytest.mark.long
def test_constraints_hold_exactly_what_the_project_installs(tmp_path):
    """constraints.txt against pip's own resolution of the project with every extra under those constraints
    (pip install --dry-run --report): the same packages at the same versions, nothing unrelated."""
    import json
    import re

    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                           "--report", str(report), "-c", str(ROOT / "constraints.txt"), f"{ROOT}[dev]"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    if proc.returncode != 0 and not report.exists():
        pytest.skip(f"the package index is out of reach to resolve the project: {proc.stderr[-300:]}")
    canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731 - PEP 503's names
    resolved = {canon(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    pins = {canon(name): version for name, version in pins.items()}
    assert {n: v for n, v in resolved.items() if n not in ("vit-lightning", "setuptools")} == pins


def test_a_compute_node_without_an_index_gets_one_line_and_nothing_installed(tmp_path):
    """A job's `make install` where no package index answers (here: an index URL on a closed local port)."""
    venv = tmp_path / "venv"
    proc = subprocess.run(["make", "install", f"VENV={venv}", f"PYTHON={sys._base_executable}"], cwd=ROOT,
                          env=clean_env(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.endswith("no package index answers from this machine (a compute node without network?): "
                                "run `make install` on a login node of this cluster (the same folder), or `make "
                                "install WHEELS=DIR` with a folder that `make wheels` filled on a machine with "
                                "network.  Stop.\n")
    assert not (venv / ".installed").exists()


@pytest.fixture
def installed(tmp_path):
    """A venv folder as `make install` leaves it (its python a stand-in: make -n only prints the steps)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")  # the index check answers
    (venv / "bin" / "python").chmod(0o755)

    def make(record: str, system: bool, *args: str) -> list[str]:
        (venv / "pyvenv.cfg").write_text(f"include-system-site-packages = {'true' if system else 'false'}\n")
        (venv / ".installed").write_text(record + "\n")
        proc = subprocess.run(["make", "-n", f"VENV={venv}", *args], cwd=ROOT, env=clean_env(), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [line for line in proc.stdout.splitlines() if "pip install" in line or "venv" in line.split()[:3]
                or line.startswith("echo")]

    return make


def test_the_stamp_records_system_site_and_wheels_and_a_change_installs_again(installed, tmp_path):
    venv = tmp_path / "venv"
    assert installed("SYSTEM_SITE= WHEELS=", False, "install") == []  # as installed: nothing to do
    steps = installed("SYSTEM_SITE= WHEELS=", False, "install", "SYSTEM_SITE=1")  # the environment's torch now
    assert steps[0].endswith(f"-m venv --clear --system-site-packages {venv}")
    assert steps[-1] == f"echo 'SYSTEM_SITE=1 WHEELS= TORCH=' > {venv}/.installed"
    assert not [s for s in steps if "constraints.txt" in s] and any(s.endswith("install --quiet   -e .") for s in steps)
    assert installed("SYSTEM_SITE=1 WHEELS=", True, "install") == []  # kept by later calls that do not name it
    assert not [s for s in installed("SYSTEM_SITE=1 WHEELS=", True, "train") if "venv" in s or "echo" in s]
    back = installed("SYSTEM_SITE=1 WHEELS=", True, "install", "SYSTEM_SITE=")
    assert back[0].endswith(f"-m venv --clear  {venv}") and back[-1] == f"echo 'SYSTEM_SITE= WHEELS= TORCH=' > {venv}/.installed"
    offline = installed("SYSTEM_SITE= WHEELS=", False, "install", "WHEELS=/w")
    assert f"install --quiet --no-index --find-links /w --no-build-isolation -c constraints.txt -e ." in " ".join(offline)
    assert offline[-1] == f"echo 'SYSTEM_SITE= WHEELS=/w TORCH=' > {venv}/.installed"
    later = installed("SYSTEM_SITE=1 WHEELS=/w", True, "install", "EXTRAS=demo")  # the folder is kept too
    assert later == [f"{venv}/bin/python -m pip install --quiet --no-index --find-links /w --no-build-isolation  "
                     "-e '.[demo]'"], later


def test_make_wheels_describes_the_target_not_the_venv_it_runs_beside(installed, tmp_path):
    """A login node's venv installed with SYSTEM_SITE=1: make wheels still pins CI's versions, torch included,
    unless SYSTEM_SITE=1 is given to it."""
    installed("SYSTEM_SITE=1 WHEELS=", True, "install")  # (the stamp of such a venv)

    def wheels(*args: str) -> str:
        proc = subprocess.run(["make", "-n", "wheels", f"VENV={tmp_path / 'venv'}", *args], cwd=ROOT,
                              env=clean_env(), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "-c constraints.txt" in wheels() and "--without-torch" not in wheels()
    assert "--without-torch" in wheels("SYSTEM_SITE=1") and "constraints.txt" not in wheels("SYSTEM_SITE=1")


OFF = ["", "0", "false", "no", "off", "False", "NO", "Off"]


@pytest.mark.parametrize("off", OFF)
def test_every_off_spelling_of_an_on_off_setting_is_off(installed, tmp_path, off):
    """SYSTEM_SITE (the Makefile's one on/off setting) is off when empty, 0, false, no or off, in any case:
    the venv does not see the environment's packages, CI's versions apply, and make wheels takes torch."""
    venv = tmp_path / "venv"
    assert installed("SYSTEM_SITE= WHEELS=", False, "install", f"SYSTEM_SITE={off}") == []  # as installed
    back = installed("SYSTEM_SITE=1 WHEELS=", True, "install", f"SYSTEM_SITE={off}")  # a venv that saw them
    assert back[0].endswith(f"-m venv --clear  {venv}"), back
    assert back[-1] == f"echo 'SYSTEM_SITE= WHEELS= TORCH=' > {venv}/.installed"
    assert back[-2].endswith("-c constraints.txt -e ."), back
    # a stamp of an earlier make that wrote the spelling as given, over a venv that does see them: made anew
    assert installed(f"SYSTEM_SITE={off} WHEELS=", True, "install")[0].endswith(f"-m venv --clear  {venv}")
    wheels = subprocess.run(["make", "-n", "wheels", f"VENV={venv}", f"SYSTEM_SITE={off}"], cwd=ROOT,
                            env=clean_env(), capture_output=True, text=True, timeout=60)
    assert wheels.returncode == 0 and "-c constraints.txt" in wheels.stdout, wheels.stderr
    assert "--without-torch" not in wheels.stdout


@pytest.mark.parametrize("on", ["1", "yes", "true", "on", "TRUE"])
def test_an_on_off_setting_is_on_otherwise(installed, tmp_path, on):
    steps = installed("SYSTEM_SITE= WHEELS=", False, "install", f"SYSTEM_SITE={on}")
    assert steps[0].endswith(f"-m venv --clear --system-site-packages {tmp_path / 'venv'}"), steps
    assert steps[-1].startswith("echo 'SYSTEM_SITE=1 WHEELS= TORCH='")


def test_a_torch_build_comes_from_pytorchs_index_and_a_changed_build_installs_again(installed, tmp_path):
    """TORCH=BUILD: torch and torchvision alone from TORCH_INDEX/BUILD, pinned to the build's local version;
    the project from the usual index with the same constraints; the stamp records it, later calls keep it,
    and another build (or none) makes the venv anew."""
    venv = tmp_path / "venv"
    pins = f"-c {venv}/constraints-cu126.txt"
    steps = installed("SYSTEM_SITE= WHEELS=", False, "install", "TORCH=cu126", "TORCH_INDEX=http://index.example/whl")
    assert steps[0].endswith(f"-m venv --clear  {venv}"), steps
    assert steps[2].endswith(f"pip install --quiet --no-deps --index-url http://index.example/whl/cu126 {pins} "
                             "torch torchvision"), steps
    assert steps[3].endswith(f"pip install --quiet  {pins} -e ."), steps  # (no index named: the usual one)
    assert steps[-1] == f"echo 'SYSTEM_SITE= WHEELS= TORCH=cu126' > {venv}/.installed"
    assert installed("SYSTEM_SITE= WHEELS= TORCH=cu126", False, "install") == []  # kept
    assert installed("SYSTEM_SITE= WHEELS= TORCH=cu126", False, "install", "EXTRAS=demo") == [
        f"{venv}/bin/python -m pip install --quiet  {pins} -e '.[demo]'"]
    for other, pin in (("TORCH=cu128", f"-c {venv}/constraints-cu128.txt"), ("TORCH=", "-c constraints.txt")):
        again = installed("SYSTEM_SITE= WHEELS= TORCH=cu126", False, "install", other)
        assert again[0].endswith(f"-m venv --clear  {venv}") and again[-2].endswith(f"{pin} -e ."), again
        assert again[-1] == f"echo 'SYSTEM_SITE= WHEELS= {other}' > {venv}/.installed"
    offline = installed("SYSTEM_SITE= WHEELS= TORCH=cu126", False, "install", "WHEELS=/w")  # the folder has it
    assert not [s for s in offline if "--index-url" in s] and offline[-2].endswith(
        f"--no-index --find-links /w --no-build-isolation {pins} -e ."), offline
    wheels = subprocess.run(["make", "-n", "wheels", f"VENV={venv}", "TORCH=cpu", "WHEELS=/w",
                             "TORCH_INDEX=http://index.example/whl"], cwd=ROOT, env=clean_env(),
                            capture_output=True, text=True, timeout=60)
    assert "scripts/torch_build.py cpu constraints.txt > /w/constraints-cpu.txt" in wheels.stdout
    assert "-c /w/constraints-cpu.txt --torch-index http://index.example/whl/cpu" in wheels.stdout, wheels.stdout


@pytest.mark.parametrize("args, message", [
    (["TORCH=cu12.6"], "TORCH=cu12.6: give one of PyTorch's builds, e.g. cu126, cu128, cu130 or cpu"),
    (["TORCH=cpu", "SYSTEM_SITE=1"], "TORCH=cpu with SYSTEM_SITE=1: the first"),
])
def test_a_torch_build_that_cannot_be_is_refused_before_anything_runs(installed, tmp_path, args, message):
    installed("SYSTEM_SITE= WHEELS=", False, "install")
    for target in ("install", "wheels"):
        proc = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}", *args], cwd=ROOT,
                              env=clean_env(), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr and not proc.stdout, proc.stdout + proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_a_builds_constraints_pin_its_local_version_and_leave_cuda_to_torch():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from torch_build import constraints_for
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    text = (ROOT / "constraints.txt").read_text()
    pins = dict(line.split("==") for line in text.splitlines() if "==" in line and not line.startswith("#"))
    built = constraints_for("cu126", text).splitlines()
    assert f"torch=={pins['torch']}+cu126" in built and f"torchvision=={pins['torchvision']}+cu126" in built
    assert not [line for line in built if line.lower().startswith(("nvidia", "cuda"))]
    assert [name for name in pins if name.lower().startswith(("nvidia", "cuda"))]  # (there were some)
    kept = {n for n in pins if not n.lower().startswith(("nvidia", "cuda")) and n not in ("torch", "torchvision")}
    assert {f"{n}=={pins[n]}" for n in kept} <= set(built) and len(built) == len(kept) + 3  # + header, torch, tv
    with pytest.raises(ValueError, match=r"TORCH=12\.6"):
        constraints_for("12.6", text)


def _stand_in_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel of ``name`` at ``version`` that holds nothing but its metadata (no dependencies)."""
    import base64
    import hashlib

    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()}"
              f",{len(text.encode())}" for path, text in files.items()]
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return wheel


@contextlib.contextmanager
def _pytorch_index(tmp_path: Path, pins: dict[str, str]):
    """A local HTTP index standing for PyTorch's (its URL, and the paths pip asked it for): at URL/cpu, torch
    and torchvision at constraints.txt's versions built as "cpu" (stand-ins), and a numpy nobody should take."""
    import http.server
    import threading

    index = tmp_path / "index" / "cpu"
    for name, version in (("torch", pins["torch"]), ("torchvision", pins["torchvision"]), ("numpy", "99.0")):
        (index / name).mkdir(parents=True)
        _stand_in_wheel(index / name, name, f"{version}+cpu")
    asked: list[str] = []

    class Index(http.server.SimpleHTTPRequestHandler):  # directory listings serve as the simple index's pages
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path / "index"), **kwargs)

        def log_message(self, *args):
            asked.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", asked
    finally:
        server.shutdown()


def _usual_index_env() -> dict[str, str]:
    """clean_env, but with pip's own settings: the usual index is whatever this machine's pip uses."""
    import os

    env = {k: v for k, v in clean_env().items() if k != "PIP_CONFIG_FILE"}
    return {**env, **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}


@pytest.mark.long
def test_a_torch_build_is_installed_from_its_index_and_nothing_else_from_it(tmp_path):
    """`make install TORCH=cpu` with a local HTTP index standing for PyTorch's (TORCH_INDEX): torch and
    torchvision come from it, at the build's local version, and pip asks it for nothing else, although it
    offers more (a numpy); everything else comes from the usual index."""
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    venv = tmp_path / "venv"
    with _pytorch_index(tmp_path, pins) as (url, asked):
        proc = subprocess.run(["make", "install", f"VENV={venv}", f"PYTHON={sys._base_executable}", "TORCH=cpu",
                               f"TORCH_INDEX={url}"], cwd=ROOT, env=_usual_index_env(), capture_output=True,
                              text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (venv / ".installed").read_text() == "SYSTEM_SITE= WHEELS= TORCH=cpu\n"
    versions = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; "
                               "print(m.version('torch'), m.version('torchvision'), m.version('numpy'))"],
                              capture_output=True, text=True, timeout=60).stdout.split()
    assert versions == [f"{pins['torch']}+cpu", f"{pins['torchvision']}+cpu", pins["numpy"]], versions
    fetched = sorted(path.rsplit("/", 1)[-1] for path in asked if path.endswith(".whl"))
    assert fetched == [f"torch-{pins['torch']}%2Bcpu-py3-none-any.whl",
                       f"torchvision-{pins['torchvision']}%2Bcpu-py3-none-any.whl"] or \
        fetched == [f"torch-{pins['torch']}+cpu-py3-none-any.whl",
                    f"torchvision-{pins['torchvision']}+cpu-py3-none-any.whl"], asked
    assert {path.split("/")[2] for path in asked} == {"torch", "torchvision"}, asked  # /cpu/NAME/...


@pytest.mark.long
def test_make_wheels_takes_a_torch_build_from_its_index_and_nothing_else_from_it(tmp_path):
    """`make wheels TORCH=cpu` with a local HTTP index standing for PyTorch's: the folder holds that build's
    torch and torchvision, fetched from it, and every other package from the usual index."""
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    wheels = tmp_path / "wheels"
    with _pytorch_index(tmp_path, pins) as (url, asked):
        proc = subprocess.run(["make", "wheels", f"WHEELS={wheels}", "TORCH=cpu", f"TORCH_INDEX={url}",
                               f"PYTHON={sys.executable}"], cwd=ROOT, env=_usual_index_env(), capture_output=True,
                              text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"(torch and torchvision from {url}/cpu)" in proc.stdout
    names = sorted(p.name.lower() for p in wheels.glob("*.whl"))
    assert f"torch-{pins['torch']}+cpu-py3-none-any.whl" in names and \
        f"torchvision-{pins['torchvision']}+cpu-py3-none-any.whl" in names, names
    assert f"numpy-{pins['numpy']}-" in " ".join(names) and not [n for n in names if n.startswith("numpy-99")]
    assert not [n for n in names if n.startswith(("nvidia", "cuda", "triton"))], names  # (the stand-ins need none)
    assert {path.split("/")[2] for path in asked} == {"torch", "torchvision"}, asked


def test_install_takes_the_commands_needs_and_the_extras_on_request(installed, tmp_path):
    core = installed("", False, "install", "SYSTEM_SITE=")  # a stamp of before: the defaults
    assert core == []
    extras = installed("SYSTEM_SITE= WHEELS=", False, "install", "EXTRAS=demo,onnx")
    assert [s.split("-c constraints.txt ")[-1] for s in extras] == ["-e '.[demo]'", "-e '.[onnx]'"]
    assert installed("SYSTEM_SITE= WHEELS=", False, "test")[0].endswith("-c constraints.txt -e '.[dev]'")
    proc = subprocess.run(["make", "-n", "install", "EXTRAS=gpu"], cwd=ROOT, env=clean_env(), capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "EXTRAS=gpu: the extras are demo onnx dev" in proc.stderr


@pytest.mark.long
def test_time_suite_times_make_test_in_a_fresh_clone_and_writes_its_record(tmp_path):
    """docs/development.md's command for the suite's time: a clone of the commit, its own install, `make test`
    (here one test file), a record with the machine, the commit, the command and the seconds."""
    import json
    import os

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout: the script clones commits")
    usage = subprocess.run(["bash", str(ROOT / "scripts" / "time_suite.sh"), "HEAD"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: bash scripts/time_suite.sh ROUNDS COMMIT..." in usage.stderr
    run = subprocess.run(["bash", str(ROOT / "scripts" / "time_suite.sh"), "1", "HEAD"], capture_output=True, text=True,
                         env={**os.environ, "RESULTS": str(tmp_path), "ARGS": "tests/test_layout.py -k import_cycles",
                              "TARGETS": "test"},  # (not the TARGETS of a time_suite.sh that runs this test)
                         timeout=1200)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert path.name == f"{head.stdout.strip()}-r1.json" and record["commit"] == head.stdout.strip()
    assert record["exit_status"] == 0, run.stderr[-3000:]
    assert record["summary"].startswith("1 passed") and 0 < record["wall_seconds"] < 600
    assert record["command"] == "make test ARGS='-p no:cacheprovider tests/test_layout.py -k import_cycles'"
    assert record["cpu"] and record["cpu_cores"] >= 1


def test_lowest_versions_pins_each_direct_dependency_at_its_bound():
    """make test-lowest's list: pyproject's lower bounds, the extras' too, torch as given."""
    import tomllib

    from packaging.requirements import Requirement

    script = [sys.executable, str(ROOT / "scripts" / "lowest_versions.py")]
    proc = subprocess.run([*script, "torch==2.14.1", "torchvision==0.29.1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pins = {Requirement(line).name: Requirement(line) for line in proc.stdout.splitlines()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [Requirement(r) for r in [*project["dependencies"], *sum(project["optional-dependencies"].values(), [])]]
    assert set(pins) == {r.name for r in declared if r.name != "vit-lightning"}
    for req in declared:
        if req.name in pins and req.name not in ("torch", "torchvision"):
            (floor,) = [s.version for s in req.specifier if s.operator == ">="]
            assert str(pins[req.name].specifier) == f"=={floor}" and pins[req.name].extras == req.extras
    assert str(pins["torch"].specifier) == "==2.14.1" and str(pins["torchvision"].specifier) == "==0.29.1"
    wrong = subprocess.run([*script, "numpy==2.0"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and wrong.stderr.strip().endswith("not a direct dependency in "
                                                                  f"{ROOT / 'pyproject.toml'}: numpy")
