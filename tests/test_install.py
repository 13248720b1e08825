"""The package installed as a user gets it: a wheel, every console script, the recipes found by name from
any directory, no deprecation warnings of our own making."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_carries_recipes_and_commands(tmp_path):
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "data", "build", "*.egg-info",
                                                                 "__pycache__", ".pytest_cache", "docs"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    assert "Deprecat" not in build.stdout + build.stderr
    (wheel,) = (tmp_path / "dist").glob("vit_lightning-*.whl")  # the distribution; the import name stays vit
    names = zipfile.ZipFile(wheel).namelist()
    assert {"vit/configs/base.yaml", "vit/configs/smoke.yaml", "vit/configs/cpu.yaml", "vit/commands/train.py"} <= set(names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for command in ("vit-train", "vit-classify", "vit-rollout", "vit-export", "vit-benchmark", "vit-report", "vit-figures"):
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
    assert "a recipe (cpu, finetune_cifar10, smoke, vit_cifar10, vit_cifar10_fast, vit_tiny_cifar10)" in text
    assert "site/vit/configs/smoke.yaml" in text.replace(" ", "")  # found in the installed package
    assert list(elsewhere.iterdir()) == []
