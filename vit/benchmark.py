"""Speed figures, measured in one run on whatever device is present (``scripts/benchmark.py``).

Model step: our ViT against timm's ``VisionTransformer`` of identical shape, same batch, same
dtype, same optimizer. The two models are timed in alternation (ours, timm, ours, timm, ...) and
the median of the rounds is reported, so a drift in the machine's speed hits both alike.
"""

from __future__ import annotations

import json
import signal
import statistics
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from vit.cifar import write_fake
from vit.model import PRESETS, ViTConfig, VisionTransformer, flops_per_image


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timm_twin(model: VisionTransformer) -> torch.nn.Module:
    """timm's VisionTransformer with exactly our model's shape."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    c = model.config
    return TimmViT(img_size=c.image_size, patch_size=c.patch_size, in_chans=c.in_channels,
                   num_classes=c.num_classes, embed_dim=c.dim, depth=c.depth, num_heads=c.heads,
                   mlp_ratio=c.mlp_ratio)


def _step_fn(model, images, labels, train: bool, autocast):
    if train:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            with autocast():
                loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        @torch.inference_mode()
        def step():
            with autocast():
                model(images)
    return step


def bench_model(preset: str, batch_size: int, device: torch.device, dtype: torch.dtype,
                steps: int, rounds: int, warmup: int = 2, compile_model: bool = False) -> dict:
    """Train and inference images/s (and peak memory on GPU) for ours vs timm's twin (both compiled
    with ``compile_model``)."""
    torch.manual_seed(0)
    ours = VisionTransformer(ViTConfig(**PRESETS[preset])).to(device)
    theirs = timm_twin(ours).to(device)
    if compile_model:
        ours.compile()
        theirs.compile()
    images = torch.randn(batch_size, 3, ours.config.image_size, ours.config.image_size, device=device)
    labels = torch.randint(0, ours.config.num_classes, (batch_size,), device=device)
    if dtype == torch.float32:
        autocast = nullcontext
    else:
        def autocast():
            return torch.autocast(device.type, dtype=dtype)
    result = {"preset": preset, "batch_size": batch_size, "dtype": str(dtype).removeprefix("torch."),
              "compiled": compile_model, "params_M": sum(p.numel() for p in ours.parameters()) / 1e6}
    for mode in ("train", "infer"):
        steps_fn = {}
        for name, model in (("ours", ours), ("timm", theirs)):
            model.train(mode == "train")
            steps_fn[name] = _step_fn(model, images, labels, mode == "train", autocast)
            for _ in range(warmup):
                steps_fn[name]()
        times = {"ours": [], "timm": []}
        peak = {}
        for _ in range(rounds):
            for name in ("ours", "timm"):
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                _sync(device)
                start = time.perf_counter()
                for _ in range(steps):
                    steps_fn[name]()
                _sync(device)
                times[name].append(time.perf_counter() - start)
                if device.type == "cuda":
                    peak[name] = torch.cuda.max_memory_allocated(device) / 2**20
        for name in ("ours", "timm"):
            result[f"{mode}_img_s_{name}"] = batch_size * steps / statistics.median(times[name])
            if peak:
                result[f"{mode}_peak_MiB_{name}"] = peak[name]
        result[f"{mode}_ratio"] = result[f"{mode}_img_s_ours"] / result[f"{mode}_img_s_timm"]
    return result


def bench_patch_embedding(preset: str, batch_size: int, device: torch.device, rounds: int) -> dict:
    """Forward+backward of E as patchify + Linear (ours) against timm's stride-P convolution."""
    from timm.layers import PatchEmbed

    model = VisionTransformer(ViTConfig(**PRESETS[preset])).to(device)
    c = model.config
    ours = model.patch_embedding
    conv = PatchEmbed(c.image_size, c.patch_size, c.in_channels, c.dim).to(device)
    images = torch.randn(batch_size, c.in_channels, c.image_size, c.image_size, device=device,
                         requires_grad=True)
    times = {"ours": [], "conv": []}
    for r in range(rounds + 2):
        for name, module in (("ours", ours), ("conv", conv)):
            _sync(device)
            start = time.perf_counter()
            for _ in range(10):
                module(images).sum().backward()
            _sync(device)
            if r >= 2:  # the first two rounds warm up
                times[name].append(time.perf_counter() - start)
    ours_s, conv_s = (10 * batch_size / statistics.median(times[k]) for k in ("ours", "conv"))
    return {"preset": preset, "batch_size": batch_size, "img_s_ours": ours_s, "img_s_conv": conv_s,
            "ratio": ours_s / conv_s}


def format_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        return f"{v:.2f}" if isinstance(v, float) and abs(v) < 100 else (f"{v:.0f}" if isinstance(v, float) else str(v))

    cells = [columns] + [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _images_per_second(batches, device, limit: int) -> float:
    it = iter(batches)
    next(it)  # start workers / warm up
    _sync(device)
    start, seen = time.perf_counter(), 0
    for images, _ in it:
        seen += len(images)
        if seen >= limit:
            break
    _sync(device)
    return seen / (time.perf_counter() - start)


def bench_data(device: torch.device, batch_size: int, workers: int, n: int) -> dict:
    """Random crop (reflect pad 4) + flip + normalise, images/s: our device path, our worker path
    (uint8 torchvision.transforms.v2), and torchvision's CIFAR10 + PIL transforms, same workers."""
    import tempfile
    from pathlib import Path

    import torchvision
    from torchvision import transforms as T

    from vit.data import CIFAR10DataModule
    from vit.device_data import DeviceBatches
    from vit.preprocessing import CIFAR10_MEAN, CIFAR10_STD, Normalize

    normalize = Normalize(CIFAR10_MEAN, CIFAR10_STD).to(device)

    class Normalised:  # the normalisation our LightningModule does on the device
        def __init__(self, batches):
            self.batches = batches

        def __iter__(self):
            for images, labels in self.batches:
                images = images.to(device, non_blocking=True)
                yield normalize(images), labels.to(device, non_blocking=True)

    class UncheckedCIFAR10(torchvision.datasets.CIFAR10):
        def _check_integrity(self):  # our generated files have their own md5s
            return True

        def _load_meta(self):  # (md5-checked in torchvision; the class names play no part here)
            self.classes = [f"c{i}" for i in range(10)]

    with tempfile.TemporaryDirectory() as tmp:
        write_fake(Path(tmp), n // 5, n // 5)
        dm = CIFAR10DataModule(root=tmp, batch_size=batch_size, val_size=10, num_workers=workers, download=False)
        dm.setup("fit")
        base = dm.train_set.dataset
        ours_device = DeviceBatches(base.images.to(device), base.labels.to(device), batch_size, seed=0,
                                    position=lambda n: (0, 0))
        tv = UncheckedCIFAR10(tmp, train=True, download=False, transform=T.Compose([
            T.RandomCrop(32, padding=4, padding_mode="reflect"), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize(CIFAR10_MEAN, CIFAR10_STD)]))
        tv_loader = torch.utils.data.DataLoader(tv, batch_size=batch_size, shuffle=True, drop_last=True,
                                                num_workers=workers, pin_memory=device.type == "cuda")
        limit = n - 2 * batch_size
        row = {"batch_size": batch_size, "workers": workers,
               "img_s_ours_device": _images_per_second(Normalised(ours_device), device, limit),
               "img_s_ours_workers": _images_per_second(Normalised(dm.train_dataloader()), device, limit),
               "img_s_torchvision": _images_per_second(Normalised(tv_loader), device, limit)}
    row["ratio_device_vs_torchvision"] = row["img_s_ours_device"] / row["img_s_torchvision"]
    row["ratio_workers_vs_torchvision"] = row["img_s_ours_workers"] / row["img_s_torchvision"]
    return row


def bench_training_step(preset: str, batch_size: int, device: torch.device, dtype: torch.dtype, steps: int,
                        compile_model: bool, config: ViTConfig | None = None, muon_ns: torch.dtype | None = None) -> dict:
    """Whole step on the device path: batch (crop+flip) → normalise → forward → loss → backward → AdamW (or,
    with ``muon_ns``, the recipe's Muon with its Newton–Schulz iteration in that dtype), of the preset's model
    (or ``config``'s, named ``preset``)."""
    from vit.device_data import DeviceBatches
    from vit.module import ViTClassifier
    from vit.preprocessing import CIFAR10_MEAN, CIFAR10_STD, Normalize

    torch.manual_seed(0)
    normalize = Normalize(CIFAR10_MEAN, CIFAR10_STD).to(device)
    module = ViTClassifier(arch=config or ViTConfig(**PRESETS[preset]),
                           optimizer={"name": "muon" if muon_ns else "adamw"})
    model = module.model.to(device).train()
    if compile_model:
        model.compile()
    fused = {"fused": True} if device.type == "cuda" else {}
    if muon_ns:
        from vit.optim import Muon

        opt = Muon(module.param_groups(1e-4, 1e-4), lr=1e-4, weight_decay=0.05, ns_dtype=muon_ns)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    n = batch_size * (steps + 3)
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 10, (n,), device=device)
    batches = iter(DeviceBatches(images, labels, batch_size, seed=0, position=lambda n: (0, 0)))
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step():
        x, y = next(batches)
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(normalize(x)), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    img_s = batch_size * steps / (time.perf_counter() - start)
    tflops = flops_per_image(model.config, train=True) * img_s / 1e12
    row = {"preset": preset, "batch_size": batch_size, "dtype": str(dtype).removeprefix("torch."),
           "compiled": compile_model, "optimizer": f"muon, NS {str(muon_ns).removeprefix('torch.')}" if muon_ns else "adamw",
           "img_s": img_s, "gflop_per_img": flops_per_image(model.config, True) / 1e9,
           "achieved_tflops": tflops}
    if device.type == "cuda":
        from lightning.fabric.utilities.throughput import get_available_flops

        peak = get_available_flops(device, dtype)  # Lightning's table of dense peaks
        row["mfu"] = tflops * 1e12 / peak if peak else None
    return row


def recipe_arch(name: str) -> ViTConfig:
    """A recipe's architecture (its own over the default recipe's, as vit-train reads them)."""
    import yaml

    from vit import configs

    arch = {}
    for recipe in (configs.DEFAULT, name):
        arch.update((yaml.safe_load(configs.path(recipe).read_text()).get("model") or {}).get("arch") or {})
    return ViTConfig(**{k: v for k, v in arch.items() if k in ViTConfig.__dataclass_fields__})


def bench_cpu_levers(batch_size: int, steps: int, rounds: int, compiled: bool) -> list[dict]:
    """The cpu recipe's model (at full size, no token dropping), whole training steps in fp32 against bf16
    autocast (and torch.compile when ``compiled``), with AdamW, and with the recipe's Muon, its Newton–Schulz
    iteration in bfloat16 (timm's) and in float32; with 1 thread and with every thread torch has: which of
    the CPU's fast paths pay at that shape. Alternating rounds, the median."""
    import statistics

    config, threads = recipe_arch("cpu"), torch.get_num_threads()
    variants = [(torch.float32, False, None), (torch.bfloat16, False, None)] + [(torch.float32, True, None)] * compiled
    variants += [(torch.float32, False, torch.bfloat16), (torch.float32, False, torch.float32)]
    rows = []
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            measured = {v: [] for v in variants}
            for _ in range(rounds):
                for dtype, comp, ns in variants:
                    measured[(dtype, comp, ns)].append(bench_training_step(
                        "cpu recipe", batch_size, torch.device("cpu"), dtype, steps, comp, config, ns))
            for values in measured.values():
                rows.append({"model": "cpu recipe", "threads": n, "batch_size": batch_size,
                             **{k: values[0][k] for k in ("dtype", "compiled", "optimizer")},
                             "img_s": statistics.median(v["img_s"] for v in values)})
    finally:
        torch.set_num_threads(threads)
    return rows


def _checkpoint(path, config: ViTConfig) -> None:
    """A checkpoint as vit-train writes it (weights + metadata), of an untrained model."""
    from vit.preprocessing import Metadata

    model = VisionTransformer(config)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "vit": Metadata(config, [str(i) for i in range(config.num_classes)], (0.5,) * 3,
                                (0.25,) * 3).to_dict()}, path)


def bench_classify(n: int, workers: int) -> dict:
    """vit-classify's work on ``n`` generated photos of mixed sizes (64–640 px, JPEG and PNG), images/s
    (vit.inference.classify_files, batch 64, top 3; start-up and the checkpoint's loading excluded): decoding
    in ``workers`` DataLoader processes vs in the main process. The model is the cpu recipe's (D=64, L=4), so decoding is what the workers share."""
    import tempfile
    from pathlib import Path

    import numpy as np
    from PIL import Image

    from vit.images import find_images
    from vit.inference import classify_files, load_classifier

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "images").mkdir()
        for i in range(n):
            h, w = rng.integers(64, 641, 2)
            ramp = np.linspace(0, 255, w)[None, :, None] * rng.random(3) + rng.normal(0, 12, (h, w, 3))
            image = Image.fromarray(np.clip(ramp, 0, 255).astype(np.uint8))
            image.save(tmp / "images" / (f"{i:05d}.jpg" if i % 4 else f"{i:05d}.png"), quality=90)
        ckpt = tmp / "model.ckpt"
        _checkpoint(ckpt, ViTConfig(dim=64, depth=4, heads=4, mlp_ratio=2.0))
        row = {"images": n, "workers": workers}
        clf = load_classifier(ckpt)
        for name, w in (("one_process", 0), ("workers", workers)):
            start = time.perf_counter()
            classify_files(clf, find_images([tmp / "images"]), 3, 64, w)  # what vit-classify does with them
            row[f"img_s_{name}"] = n / (time.perf_counter() - start)
    row["ratio"] = row["img_s_workers"] / row["img_s_one_process"]
    return row


def bench_checkpoint(device: torch.device, repeats: int, interval_minutes: float = 10.0) -> list[dict]:
    """The step checkpoint's cost: seconds per ``trainer.save_checkpoint`` (what the rolling step checkpoint and
    the preemption stop write: weights, optimizer, EMA, loops, callbacks' states, RNG states, to local disk),
    median of ``repeats``, after one training step of the default recipe's model (Muon, EMA) and of the cpu
    recipe's; and its share of training time when written every ``interval_minutes``."""
    import tempfile
    import warnings
    from pathlib import Path

    import lightning as L

    from vit.data import CIFAR10DataModule
    from vit.module import ViTClassifier
    from vit.resume import RNGStates

    shapes = {"vit_cifar10": ViTConfig(dim=192, depth=9, heads=12, mlp_ratio=2.0),
              "cpu": ViTConfig(dim=64, depth=4, heads=4, mlp_ratio=2.0)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tmp = Path(tmp)
        write_fake(tmp, 256 // 5, 256 // 5)
        for recipe, config in shapes.items():
            model = ViTClassifier(arch=config, optimizer={"name": "muon"}, ema_decay=0.999)
            dm = CIFAR10DataModule(root=str(tmp), batch_size=64, val_size=64, num_workers=0, download=False)
            trainer = L.Trainer(accelerator=device.type, devices=1, max_steps=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                limit_val_batches=0, callbacks=[RNGStates()], default_root_dir=tmp)
            trainer.fit(model, datamodule=dm)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                trainer.save_checkpoint(tmp / "step.ckpt")
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            rows.append({"recipe": recipe, "params_M": round(sum(p.numel() for p in model.model.parameters()) / 1e6, 2),
                         "MB": round((tmp / "step.ckpt").stat().st_size / 2**20, 1), "s_per_save": round(seconds, 3),
                         "interval_min": interval_minutes,
                         "share_percent": round(100 * seconds / (60 * interval_minutes), 4)})
    return rows


def bench_startup(repeats: int) -> dict:
    """Seconds to classify one image from the shell, against `python -c "import torch, torchvision"`."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model.ckpt"
        _checkpoint(ckpt, ViTConfig(**PRESETS["vit_tiny"]))
        Image.new("RGB", (64, 48), (120, 30, 200)).save(Path(tmp) / "cat.png")
        commands = {"import": [sys.executable, "-c", "import torch, torchvision"],
                    "classify": [sys.executable, "-m", "vit.commands.classify", "--checkpoint", str(ckpt),
                                 str(Path(tmp) / "cat.png")]}
        times = {k: [] for k in commands}
        for _ in range(repeats):
            for name, cmd in commands.items():
                start = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                times[name].append(time.perf_counter() - start)
    row = {f"s_{k}": statistics.median(v) for k, v in times.items()}
    row["ratio"] = row["s_classify"] / row["s_import"]
    return row


SECTIONS = ("model", "data", "step", "levers", "classify", "checkpoint", "startup")


class TimeBound(BaseException):
    """The benchmark's --minutes ran out in a section (a BaseException, as KeyboardInterrupt is: library code
    that catches Exception, torch.compile's for one, lets it through)."""


@contextmanager
def time_bound(deadline: float | None):
    """Raise TimeBound in the main thread at ``deadline`` (time.monotonic()); no bound with None."""
    if deadline is None:
        yield
        return

    def expire(signum, frame):
        raise TimeBound

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, deadline - time.monotonic()))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def section(name: str, report: dict, args, device: torch.device, dtype: torch.dtype) -> None:
    """Measure one section into ``report`` and print its table."""
    quick = args.quick
    steps, rounds = (1, 1) if quick else (args.steps, args.rounds)
    presets = ["vit_tiny"] if quick else args.presets
    batch = 8 if quick else args.batch_size
    if name == "model":
        report["patch_embedding"] = [bench_patch_embedding(presets[0], batch, device, rounds)]
        print("# patch embedding E, forward+backward, images/s: patchify + Linear vs timm's strided conv")
        print(format_table(report["patch_embedding"], ["preset", "batch_size", "img_s_ours", "img_s_conv", "ratio"]))
        report["model"] = [bench_model(p, batch, device, dtype, steps, rounds, warmup=1 if quick else 2,
                                       compile_model=args.compile) for p in presets]
        print("# model step, images/s, ours vs timm's VisionTransformer of the same shape")
        print(format_table(report["model"], ["preset", "batch_size", "dtype", "train_img_s_ours", "train_img_s_timm",
                                             "train_ratio", "infer_img_s_ours", "infer_img_s_timm", "infer_ratio"]
                           + (["train_peak_MiB_ours", "train_peak_MiB_timm"] if device.type == "cuda" else [])))
    elif name == "data":
        n = 1000 if quick else args.data_images
        report["data"] = [bench_data(device, 64 if quick else args.data_batch_size, args.workers, n)]
        print(f"# data path: crop(pad 4, reflect) + flip + normalise, images/s ({args.workers} workers for loaders)")
        print(format_table(report["data"], ["batch_size", "workers", "img_s_ours_device", "img_s_ours_workers",
                                            "img_s_torchvision", "ratio_device_vs_torchvision",
                                            "ratio_workers_vs_torchvision"]))
    elif name == "step":
        report["step"] = [bench_training_step(p, batch if quick else args.step_batch_size, device, dtype, steps,
                                              args.compile) for p in presets]
        print("# whole training step (device data path + forward + backward + AdamW)")
        print(format_table(report["step"], ["preset", "batch_size", "dtype", "compiled", "img_s", "gflop_per_img",
                                            "achieved_tflops"] + (["mfu"] if device.type == "cuda" else [])))
    elif name == "levers":
        report["levers"] = bench_cpu_levers(8 if quick else 128, 1 if quick else 10, rounds, args.compile)
        print("# the cpu recipe's model, whole training step on the CPU: fp32, bf16 autocast"
              + (", torch.compile" if args.compile else "") + "; images/s")
        print(format_table(report["levers"], ["model", "threads", "batch_size", "dtype", "compiled", "optimizer",
                                              "img_s"]))
    elif name == "classify":
        report["classify"] = bench_classify(40 if quick else args.classify_images, args.workers)
        print(f"# vit-classify throughput on generated photos of mixed sizes, images/s: "
              f"{args.workers} decoding workers vs the main process")
        print(format_table([report["classify"]], ["images", "workers", "img_s_one_process", "img_s_workers", "ratio"]))
    elif name == "checkpoint":
        report["checkpoint"] = bench_checkpoint(device, 1 if quick else args.rounds)
        print("# the step checkpoint: seconds per save (trainer.save_checkpoint, local disk) and its share of "
              "training at the default interval")
        print(format_table(report["checkpoint"], ["recipe", "params_M", "MB", "s_per_save", "interval_min",
                                                  "share_percent"]))
    elif name == "startup":
        report["startup"] = bench_startup(1 if quick else args.startup_repeats)
        print("# classify one image from the shell vs `python -c 'import torch, torchvision'`, seconds (median)")
        print(format_table([report["startup"]], ["s_import", "s_classify", "ratio"]))


def run(args) -> dict:
    """The sections asked, in order, into one report (written to --output after each). With --minutes, a
    section still running at the bound is cut short and the report lists it and the rest under
    ``sections_pending`` (StoppedEarly); the same command again measures only those and completes the
    report. The report's provenance is its first command's."""
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[
        args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")]
    from vit.results import provenance

    deadline = time.monotonic() + 60 * args.minutes if args.minutes else None
    report = {**provenance(list(args.argv), "benchmark", device.type, 1), "torch": torch.__version__}
    todo = args.sections.split(",")
    unknown = [name for name in todo if name not in SECTIONS]
    if unknown:
        raise BenchmarkError(f"--sections: no section {', '.join(unknown)} (there are {', '.join(SECTIONS)})")
    if args.output and Path(args.output).is_file():
        earlier = json.loads(Path(args.output).read_text())
        if earlier.get("sections_pending"):  # a bounded benchmark's earlier command: go on with what remains
            report, todo = earlier, earlier["sections_pending"]
            print(f"continuing {args.output}: sections {', '.join(todo)}")
    for i, name in enumerate(todo):
        report["sections_pending"] = todo[i:]
        try:
            with time_bound(deadline):
                section(name, report, args, device, dtype)
        except TimeBound:
            write_report(report, args.output)
            if i == 0:
                raise BenchmarkError(f"section {name} alone takes longer than --minutes {args.minutes:g}: "
                                     f"raise --minutes, or measure fewer rounds or presets") from None
            raise StoppedEarly(f"--minutes {args.minutes:g} ran out in section {name}: sections "
                               f"{', '.join(todo[i:])} remain. Run the same command again to measure them "
                               f"({args.output} keeps the sections done)") from None
        report["sections_pending"] = todo[i + 1:]
        write_report(report, args.output)
    report.pop("sections_pending")
    write_report(report, args.output)
    if args.output:
        print(f"wrote {args.output}")
    return report


class BenchmarkError(Exception):
    """A benchmark that cannot run as asked; the message says why (exit 2)."""


class StoppedEarly(Exception):
    """--minutes ran out; the report says which sections remain (exit 4)."""


def write_report(report: dict, output: str | None) -> None:
    if output:
        Path(output).write_text(json.dumps(report, indent=2) + "\n")
