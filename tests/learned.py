"""The tiny trainings whose learned quality tests assert (tests/test_rollout.py, tests/test_model.py), each a
function of its seed, and the margins of their thresholds over seeds:

    python tests/learned.py --seeds 24        writes results/test-margins/learned.json (machine, commit,
                                              command, each seed's figures, the worst seed's)

A test runs seed 0 and asserts a threshold below the worst figure, in that record, of the seeds that learn
the task (``worst_learned``: accuracy above 0.9)."""

from __future__ import annotations

import torch

import vit
from vit.models.rollout import explain

COLOURS = torch.tensor([[1.0, 0.1, 0.1], [0.1, 1.0, 0.1], [0.1, 0.1, 1.0], [1.0, 1.0, 0.1]])


def bright_patch_task(n, seed, distractors=3, dim=0.5):
    """16×16 grey-noise images of 4×4 patches: one random patch in full colour, whose colour is the class,
    and ``distractors`` other patches in dimmed random class colours. The mean of the patches does not
    tell the class (the distractors confound it), so the model must look at the brightest patch."""
    g = torch.Generator().manual_seed(seed)
    images = 0.3 + torch.rand(n, 3, 16, 16, generator=g) * 0.1
    labels = torch.randint(0, 4, (n,), generator=g)
    order = torch.stack([torch.randperm(16, generator=g) for _ in range(n)])
    where = order[:, 0]
    for i in range(n):
        for k, colour in enumerate([COLOURS[labels[i]]] + [dim * COLOURS[torch.randint(0, 4, (1,), generator=g)][0]
                                                            for _ in range(distractors)]):
            r, c = divmod(order[i, k].item(), 4)
            images[i, :, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] = colour[:, None, None]
    return images, labels, where


def rollout_figures(seed: int) -> dict[str, float]:
    """A tiny ViT trained 400 steps on the bright-patch task (model init and data from ``seed``), on 200 new
    images: its accuracy; attention rollout at the decisive patch against its mean (median image); how often
    rollout's argmax is that patch; gradient rollout at that patch against its mean (median image)."""
    torch.manual_seed(seed)
    model = vit.VisionTransformer(vit.ViTConfig(image_size=16, patch_size=4, num_classes=4, dim=32, depth=2, heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, labels, _ = bright_patch_task(512, seed=seed)
    for _ in range(400):
        idx = torch.randint(0, 512, (64,))
        loss = torch.nn.functional.cross_entropy(model(images[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    test_images, test_labels, where = bright_patch_task(200, seed=1000 + seed)
    probs, rollout = explain(model, test_images)
    flat = rollout.flatten(1)
    _, why = explain(model, test_images, method="gradient")
    why = why.flatten(1)
    return {"accuracy": (probs.argmax(-1) == test_labels).float().mean().item(),
            "rollout_ratio": (flat.gather(1, where[:, None]).squeeze(1) / flat.mean(1)).median().item(),
            "rollout_hits": (flat.argmax(-1) == where).float().mean().item(),
            "gradient_ratio": (why.gather(1, where[:, None]).squeeze(1) / why.mean(1)).median().item()}


def steps_to_fit_random_labels(seed: int, steps: int = 300, every: int = 5) -> int | None:
    """A tiny ViT trained on 64 random images with random labels (from ``seed``): the first step, checked every
    ``every``, at which it classifies 95 % of them right, or None within ``steps``."""
    torch.manual_seed(seed)
    x = torch.randn(64, 3, 16, 16)
    y = torch.randint(0, 10, (64,))
    model = vit.VisionTransformer(vit.ViTConfig(image_size=16, patch_size=4, dim=64, depth=2, heads=4))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for step in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == every - 1:
            with torch.no_grad():
                if (model(x).argmax(-1) == y).float().mean().item() >= 0.95:
                    return step + 1
    return None


def main() -> None:
    import argparse
    import json
    import shlex
    import sys
    from datetime import datetime, timezone
    from pathlib import Path

    from vit.training.commits import commit
    from vit.training.results import cpu_model, keep_diff

    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=24, help="seeds 0 to N-1 (default 24)")
    parser.add_argument("--output", type=Path, default=root / "results" / "test-margins" / "learned.json")
    args = parser.parse_args()
    provenance = commit()  # (read before the runs: an edit made while they run does not count)
    torch.set_num_threads(1)  # as the tests run them
    rollout = [rollout_figures(seed) for seed in range(args.seeds)]
    fitted = [steps_to_fit_random_labels(seed) for seed in range(args.seeds)]
    record = {"command": shlex.join(["python", "tests/learned.py", *sys.argv[1:]]), **provenance,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": cpu_model(),
              "cpu": cpu_model(), "torch_threads": 1, "torch": torch.__version__, "seeds": args.seeds,
              "rollout": {"per_seed": rollout, "worst": {k: min(r[k] for r in rollout) for k in rollout[0]},
                          "learned": [seed for seed, r in enumerate(rollout) if r["accuracy"] > 0.9],
                          "worst_learned": {k: min(r[k] for r in rollout if r["accuracy"] > 0.9) for k in rollout[0]}},
              "random_labels": {"steps_per_seed": fitted, "worst": None if None in fitted else max(fitted)}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    keep_diff(args.output, record)  # (made from uncommitted changes: their diff beside it, named in the record)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({"rollout worst": record["rollout"]["worst"], "random labels": fitted}, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
