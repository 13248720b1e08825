"""The benchmark runs end to end in quick mode and writes every field README figures come from."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_quick_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "scripts/benchmark.py", "--quick", "--device", "cpu",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["device"] and report["torch"]
    (row,) = report["model"]
    for mode in ("train", "infer"):
        for who in ("ours", "timm"):
            assert row[f"{mode}_img_s_{who}"] > 0
        assert row[f"{mode}_ratio"] == row[f"{mode}_img_s_ours"] / row[f"{mode}_img_s_timm"]
    assert report["patch_embedding"][0]["img_s_conv"] > 0
    assert "train_ratio" in proc.stdout
