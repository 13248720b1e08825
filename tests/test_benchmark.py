"""The benchmark runs end to end in quick mode and writes every field README figures come from."""

import json

import pytest
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.long
def test_benchmark_quick_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "scripts/benchmark.py", "--quick", "--device", "cpu", "--sections",
                           "model,data,step,checkpoint,classify,startup,levers", "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["device"] and report["torch"]
    (row,) = report["model"]
    for mode in ("train", "infer"):
        for who in ("ours", "timm"):
            assert row[f"{mode}_img_s_{who}"] > 0
        assert row[f"{mode}_ratio"] == row[f"{mode}_img_s_ours"] / row[f"{mode}_img_s_timm"]
    assert report["patch_embedding"][0]["img_s_conv"] > 0
    (data,) = report["data"]
    for key in ("img_s_ours_device", "img_s_ours_workers", "img_s_torchvision"):
        assert data[key] > 0
    assert data["ratio_device_vs_torchvision"] == data["img_s_ours_device"] / data["img_s_torchvision"]
    (step,) = report["step"]
    assert step["img_s"] > 0 and step["gflop_per_img"] > 0
    assert step["achieved_tflops"] == pytest.approx(step["img_s"] * step["gflop_per_img"] / 1000)
    assert [row["recipe"] for row in report["checkpoint"]] == ["vit_cifar10", "cpu"]
    for row in report["checkpoint"]:  # the step checkpoint's cost, as README's preemption paragraph gives it
        assert row["s_per_save"] > 0 and row["MB"] > 0
        # (s_per_save is rounded to 1 ms, share_percent to 1e-4: their rounding is the tolerance)
        rounding = 100 * 0.0005 / (60 * row["interval_min"]) + 0.00005
        assert row["share_percent"] == pytest.approx(100 * row["s_per_save"] / (60 * row["interval_min"]), abs=rounding)
    assert report["startup"]["s_classify"] > 0 and report["startup"]["ratio"] > 0
    levers = report["levers"]  # the cpu recipe's model in fp32 and bf16, at 1 thread and at all of them
    assert {(row["dtype"], row["compiled"]) for row in levers} == {("float32", False), ("bfloat16", False)}
    assert {row["threads"] for row in levers} == {1, torch_threads()} and all(row["img_s"] > 0 for row in levers)
    assert isinstance(report["cpu_bf16"], list)
    assert "train_ratio" in proc.stdout and "ratio_device_vs_torchvision" in proc.stdout


def test_analytic_flops_follow_the_notes():
    from vit.model import flops_per_image
    from vit.model import ViTConfig, VisionTransformer

    m = VisionTransformer(ViTConfig(image_size=32, patch_size=4, dim=192, depth=12, heads=3))
    t, d = 65, 192
    expected = 12 * 2 * (12 * t * d * d + 2 * t * t * d) + 2 * 64 * 48 * d + 2 * d * 10
    assert flops_per_image(m.config, train=False) == expected
    assert flops_per_image(m.config, train=True) == 3 * expected
    half = ViTConfig(dim=192, depth=12, heads=3, mlp_ratio=2.0)  # the MLP's share scales with its ratio
    assert flops_per_image(half) == expected - 12 * 2 * (4 * t * d * d)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()
