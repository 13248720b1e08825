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
                           "model,data,step,checkpoint,classify,startup,fast-paths", "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
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
    assert report["peak"]["tflops"] > 0 and 0 < step["peak_fraction"] <= 4  # (--quick: 1024², see below)
    assert [row["recipe"] for row in report["checkpoint"]] == ["vit_cifar10", "cpu"]
    for row in report["checkpoint"]:  # the step checkpoint's cost, as README's preemption paragraph gives it
        assert row["s_per_save"] > 0 and row["MB"] > 0
        # (s_per_save is rounded to 1 ms, share_percent to 1e-4: their rounding is the tolerance)
        rounding = 100 * 0.0005 / (60 * row["interval_min"]) + 0.00005
        assert row["share_percent"] == pytest.approx(100 * row["s_per_save"] / (60 * row["interval_min"]), abs=rounding)
    assert report["startup"]["s_classify"] > 0 and report["startup"]["ratio"] > 0
    fast = report["fast-paths"]  # the cpu recipe's model in fp32 and bf16, at 1 thread and at all of them
    assert {(row["dtype"], row["compiled"]) for row in fast} == {("float32", False), ("bfloat16", False)}
    assert {row["threads"] for row in fast} == {1, torch_threads()} and all(row["img_s"] > 0 for row in fast)
    assert isinstance(report["cpu_bf16"], list)
    assert "train_ratio" in proc.stdout and "ratio_device_vs_torchvision" in proc.stdout


def test_analytic_flops_follow_the_notes():
    from vit.models.model import flops_per_image
    from vit.models.model import ViTConfig, VisionTransformer

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


def test_a_bounded_benchmark_stops_with_the_sections_left_and_the_same_command_finishes_them(tmp_path, monkeypatch,
                                                                                               capsys):
    """vit-benchmark --minutes (each command of `make figures` is bounded): the section running at the bound
    is cut short, the report keeps the sections done and lists the rest (exit 4); the same command again
    measures only those (exit 0), under the first command's provenance. A section that alone outlasts the
    bound is exit 2 with one line. (Sections stand in for the real ones: one takes 300 s until it is fast.)"""
    import time

    import lightning  # noqa: F401  (the report's provenance imports these after the bound's clock starts:
    import timm  # noqa: F401  seconds in a fresh process, here before it, so that the bound is the sections')

    from vit.benchmark import runner
    from vit.commands.benchmark import main

    slow = {"data": 300.0}
    measured = []

    def section(name, report, args, device, dtype):
        time.sleep(slow.get(name, 0.01))
        report[name] = [{"img_s": 1.0}]
        measured.append(name)

    monkeypatch.setattr(runner, "section", section)
    out = tmp_path / "bench.json"
    command = ["--device", "cpu", "--sections", "model,data,step", "--output", str(out), "--minutes", "0.25"]
    started = time.monotonic()
    assert main(command) == 4
    assert 15 <= time.monotonic() - started < 150  # cut at 15 s, not before, nor after the 300 s section
    first = json.loads(out.read_text())
    assert "model" in first and "data" not in first and first["sections_pending"] == ["data", "step"]
    assert "stopped: --minutes 0.25 ran out in section data: sections data, step remain" in capsys.readouterr().err
    slow.clear()
    assert main(command) == 0
    report = json.loads(out.read_text())
    assert measured == ["model", "data", "step"] and "sections_pending" not in report
    assert report["date"] == first["date"] and report["model"] == first["model"]
    slow["model"] = 300.0  # (a bound of 3 s: however late the sections start, the first one is cut)
    assert main([*command[:-3], str(tmp_path / "other.json"), "--minutes", "0.05"]) == 4  # (a stop, as any bound's)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "stopped: --minutes 0.05 ran out in section model, the first this command measured, which alone " \
                   "takes longer: raise --minutes, or measure fewer rounds or presets"
    assert json.loads((tmp_path / "other.json").read_text())["sections_pending"] == ["model", "data", "step"]


def test_records_of_the_fast_paths_render_under_their_earlier_key_too():
    """The fast-paths section's rows were written under "levers" before it had that name: both render alike."""
    from vit.reporting.tables import _bench_rows

    record = json.loads((ROOT / "results" / "benchmark-cpu-fast-paths" / "fast-paths-muon.json").read_text())
    rows = _bench_rows(record)
    assert any("Newton–Schulz in float32" in row[0] for row in rows) and any("bf16 autocast" in row[0] for row in rows)
    renamed = {("fast-paths" if k == "levers" else k): v for k, v in record.items()}
    assert "levers" not in renamed and _bench_rows(renamed) == rows


def test_the_training_step_is_shown_beside_the_machines_matmul_peak(tmp_path, monkeypatch, capsys):
    """The step section measures the matmul peak first (a small product under --quick only, 4096² at least
    otherwise) and gives each step's achieved TFLOP/s as a fraction of it; README's row shows it."""
    from argparse import Namespace

    import torch

    from vit.benchmark import peak
    from vit.commands.benchmark import main
    from vit.reporting.tables import _bench_rows

    out = tmp_path / "bench.json"
    assert main(["--quick", "--device", "cpu", "--sections", "step", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    p, (step,) = report["peak"], report["step"]
    assert p["size"] == peak.QUICK_SIZE and p["dtype"] == "float32" and p["repeats"] >= 3 and p["tflops"] > 0
    assert p["threads"] == torch.get_num_threads() and p["products_per_repeat"] >= 1
    assert step["peak_fraction"] == pytest.approx(step["achieved_tflops"] / p["tflops"])
    # under --quick the product is 1024², short of the peak, and a busy machine slows it more than the step:
    # the fraction is only bounded loosely here (the default size is checked below)
    assert 0 < step["peak_fraction"] <= 4
    assert "peak_fraction" in capsys.readouterr().out
    (row,) = [row for row in _bench_rows(report) if row[0].startswith("whole training step")]
    assert row[2].startswith(f"matmul peak {p['tflops']:.3g} TFLOP/s ({p['size']}², float32")
    assert row[3] == f"**{step['peak_fraction']:.2f}**"
    earlier = json.loads((ROOT / "results" / "benchmark-cpu" / "cpu.json").read_text())  # before the peak
    assert "peak" not in earlier and all(row[2:4] == ["—", "—"] for row in _bench_rows(earlier)
                                         if row[0].startswith("whole training step"))

    sizes = []  # without --quick the product is the real one, and it is measured once per report
    monkeypatch.setattr(peak, "matmul_peak", lambda device, dtype, size: sizes.append(size) or {"tflops": 1.0})
    measured = {}
    for _ in range(2):
        peak.section(measured, Namespace(quick=False), torch.device("cpu"), torch.float32)
    assert sizes == [peak.SIZE] and peak.SIZE >= 4096


def test_the_time_bound_and_the_report_work_apart(tmp_path):
    """time_bound cuts what runs at its deadline short (TimeBound, a BaseException that `except Exception`
    lets through) and leaves what ends in time alone; the report module writes the JSON and the tables."""
    import signal
    import time

    from vit.benchmark.report import format_table, write_report
    from vit.benchmark.time_bound import TimeBound, time_bound

    handler, idle = signal.getsignal(signal.SIGALRM), (0.0, 0.0)
    started, stopped = time.monotonic(), []
    with pytest.raises(TimeBound):
        with time_bound(started + 0.3):
            try:
                time.sleep(20)
            except Exception:  # a library's broad except does not swallow the bound
                stopped.append("swallowed")
    assert time.monotonic() - started < 10 and not stopped
    assert signal.getitimer(signal.ITIMER_REAL) == idle and signal.getsignal(signal.SIGALRM) is handler
    with time_bound(time.monotonic() + 60):
        time.sleep(0.01)
    # the bound ended with its block: no timer is left to fire later, and SIGALRM is handled as before
    assert signal.getitimer(signal.ITIMER_REAL) == idle and signal.getsignal(signal.SIGALRM) is handler
    with time_bound(None):
        time.sleep(0.01)
    report = {"step": [{"preset": "vit_tiny", "img_s": 1234.5, "peak_fraction": 0.01234}]}
    write_report(report, str(tmp_path / "r.json"))
    write_report(report, None)
    assert json.loads((tmp_path / "r.json").read_text()) == report and list(tmp_path.iterdir()) == [tmp_path / "r.json"]
    header, rule, line = format_table(report["step"], ["preset", "img_s", "peak_fraction"]).splitlines()
    assert header.split() == ["preset", "img_s", "peak_fraction"] and set(rule) <= {"-", " "}
    assert line.split() == ["vit_tiny", "1234", "0.0123"]


@pytest.mark.long
def test_the_folders_section_times_a_first_start_and_a_requeue(tmp_path):
    """2,000 generated JPEGs (--quick), two starts on 2 processes: the first checks every image and writes the
    folder's index, the second reads it (the section refuses a second start that checked again)."""
    from vit.reporting.tables import _bench_rows

    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "scripts/benchmark.py", "--quick", "--device", "cpu", "--sections",
                           "folders", "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    f = json.loads(out.read_text())["folders"]
    assert f["images"] == 2000 and f["processes"] == 2
    assert f["s_first_start"] > 0 and f["s_requeue"] > 0 and f["ratio"] == f["s_requeue"] / f["s_first_start"]
    assert 0 < f["s_walk"] < f["s_walk_and_check"]
    assert 0 < f["s_first_start_data"] < f["s_first_start"] and 0 < f["s_requeue_data"] < f["s_requeue"]
    rows = _bench_rows({"folders": f})
    assert [row[4] for row in rows] == ["≤ 0.1", "—", "—"] and rows[0][1] == f"{f['s_requeue']:.1f}"


def breakdown(tmp_path, modes: str) -> dict:
    from vit.commands.benchmark import main

    out = tmp_path / "bench.json"
    assert main(["--quick", "--device", "cpu", "--sections", "breakdown", "--breakdown-modes", modes,
                 "--output", str(out)]) == 0
    return json.loads(out.read_text())


def check_breakdown_row(row: dict, peak: dict) -> None:
    parts = [row["data_ms"], row["model_ms"], row["optimizer_ms"]]
    assert min(parts) >= 0 and row["step_ms"] > 0
    # the parts are ranges inside the profiled steps: only the two clocks' rounding separates them
    assert sum(parts) <= row["profiled_ms"] * 1.05
    assert row["rest_ms"] == pytest.approx(row["profiled_ms"] - sum(parts))
    assert row["img_s"] == pytest.approx(row["batch_size"] * 1000 / row["step_ms"])
    assert row["peak_fraction"] == pytest.approx(row["achieved_tflops"] / peak["tflops"])
    assert isinstance(row["launches_per_step"], float) and row["launches_per_step"] > 0
    assert row["host_syncs_per_step"] == 0  # neither the step nor the optimizer asks the device for a value


def test_the_breakdown_splits_a_step_into_data_model_optimizer_and_the_rest(tmp_path, capsys):
    """--sections breakdown on the CPU (--quick: a small model of the default recipe's shape, batch 8): each
    part's ms per step, their sum within the profiled steps' wall time, launches and host syncs per step."""
    report = breakdown(tmp_path, "eager")
    (eager,) = report["breakdown"]
    assert eager["mode"] == "eager" and eager["batch_size"] == 8 and eager["dtype"] == "float32"
    check_breakdown_row(eager, report["peak"])
    out = capsys.readouterr().out
    assert "rest_ms" in out and "launches_per_step" in out
    from vit.reporting.tables import _bench_rows  # the record's rows on a page: each part's ms, as the report has them

    rows = [row for row in _bench_rows(report) if row[0].startswith("where a training step goes")]
    assert len(rows) == 1
    assert rows[0][1].startswith(f"{eager['step_ms']:.1f} ({eager['data_ms']:.1f} / {eager['model_ms']:.1f} / ")
    assert f"**{eager['peak_fraction']:.2f}**" in rows[0][3]


@pytest.mark.long
def test_the_breakdown_of_a_compiled_step(tmp_path):
    report = breakdown(tmp_path, "compiled")
    (compiled,) = report["breakdown"]
    assert compiled["mode"] == "compiled"
    check_breakdown_row(compiled, report["peak"])


def test_on_cuda_a_parts_time_is_its_kernels_wherever_its_ops_ran():
    """part_ms on a CUDA profile (made up here): a kernel counts for the part in whose range the op that
    launched it started (a range's start is in it, its end is not), on any thread (the backward's engine thread
    too); the GPU-side annotation ranges are not kernels, and a kernel of no part's op is the rest's. On a CPU
    a part's time is its ranges'."""
    import torch
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from vit.benchmark.breakdown import kernels, part_ms

    def cpu(id, name, start, end, thread=1):
        return FunctionEvent(id, name, thread, start, end)

    def gpu(id, name, start, end, linked, annotation=False):
        return FunctionEvent(id, name, 0, start, end, device_type=DeviceType.CUDA, linked_correlation_id=linked,
                             is_user_annotation=annotation)

    events = [cpu(1, "data", 0, 10), cpu(2, "aten::index", 1, 5),
              cpu(3, "model", 10, 100), cpu(4, "aten::mm", 10, 20), cpu(5, "aten::mm", 40, 50, thread=2),
              cpu(6, "optimizer", 100, 130), cpu(7, "aten::_foreach_add_", 101, 110), cpu(8, "aten::add", 140, 141),
              gpu(100, "index_kernel", 12, 14, linked=2), gpu(101, "gemm", 20, 50, linked=4),
              gpu(102, "gemm", 60, 80, linked=5), gpu(103, "foreach", 110, 115, linked=7),
              gpu(104, "add", 150, 151, linked=8), gpu(105, "model", 20, 80, linked=3, annotation=True)]
    assert [e.name for e in kernels(events)] == ["index_kernel", "gemm", "gemm", "foreach", "add"]
    assert part_ms(events, torch.device("cuda"), steps=1) == pytest.approx({"data": 0.002, "model": 0.05,
                                                                           "optimizer": 0.005})
    assert part_ms(events, torch.device("cpu"), steps=2) == pytest.approx({"data": 0.005, "model": 0.045,
                                                                          "optimizer": 0.015})
