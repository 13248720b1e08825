"""AutoAugment and random erasing on the device (vit.data.device_augment): for the same draws, image by image
and bit for bit, torchvision's AutoAugment and timm's RandomErasing; draws distributed as theirs; a fixed
number of batched operations, none of which waits for the device."""

import math
import random
from types import SimpleNamespace

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import AutoAugmentPolicy, InterpolationMode
from torchvision.transforms.v2 import functional as TF

from vit.data.device_augment import (CIFAR10_POLICY, SIGNED, AutoAugment, AutoAugmentDraws, autoaugment,
                                     autoaugment_draws, erase, erasing_boxes, magnitudes, random_erasing,
                                     random_erasing_draws)

SPACE = v2.AutoAugment._AUGMENTATION_SPACE
CIFAR10 = v2.AutoAugment(AutoAugmentPolicy.CIFAR10)._policies


@pytest.fixture(autouse=True)
def one_thread():
    """Thousands of small per-image calls: one thread's (conftest restores the count), as fast on a busy
    machine as on an idle one; the results do not depend on it."""
    torch.set_num_threads(1)


def sample_images(n: int, c: int = 3, h: int = 32, w: int = 32, seed: int = 0) -> torch.Tensor:
    """Noise, and the cases the histogram and range ops treat apart: smooth gradients, a narrow range of
    values, constant images, two values, one channel constant."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g)
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    x[1::6] = ((rows * 7 + cols * 3 + torch.arange(c).view(c, 1, 1) * 50) % 256).to(torch.uint8)
    x[2::6] = x[2::6] // 16 + 100
    x[3::6] = torch.randint(0, 256, (len(x[3::6]), c, 1, 1), dtype=torch.uint8, generator=g)
    x[4::6] = (x[4::6] > 128).to(torch.uint8) * 200 + 20
    x[5::6, 0] = 255
    return x


def test_the_policy_and_magnitudes_are_torchvisions():
    """vit.data.device_augment's copies of what torchvision keeps private: the CIFAR-10 policy table, the
    magnitude bins of each op (for several image sizes) and which ops are signed."""
    assert CIFAR10_POLICY == tuple(tuple(sub) for sub in CIFAR10)
    for op, (bins_fn, signed) in SPACE.items():
        assert (op in SIGNED) == signed, op
        for h, w in ((32, 32), (17, 23), (224, 160)):
            expected, ours = bins_fn(10, h, w), magnitudes(op, h, w)
            assert (ours is None) == (expected is None) and (ours is None or torch.equal(ours, expected)), op


def magnitude(op: str, magnitude_bin, negative: bool, h: int, w: int) -> float:
    """torchvision's AutoAugment.forward: the bin's magnitude, negated for a signed op."""
    magnitudes_fn, signed = SPACE[op]
    magnitudes = magnitudes_fn(10, h, w)
    if magnitudes is None:
        return 0.0
    m = float(magnitudes[magnitude_bin])
    return -m if signed and negative else m


def reference_op(image: torch.Tensor, op: str, m: float) -> torch.Tensor:
    """One op on one C×H×W image, through torchvision.transforms.v2.functional with the parameters
    torchvision's AutoAugment passes (interpolation nearest, fill None: 0)."""
    nearest = InterpolationMode.NEAREST
    if op in ("ShearX", "ShearY"):
        shear = math.degrees(math.atan(m))
        return TF.affine(image, angle=0.0, translate=[0, 0], scale=1.0, interpolation=nearest, fill=None,
                         shear=[shear, 0.0] if op == "ShearX" else [0.0, shear], center=[0, 0])
    if op in ("TranslateX", "TranslateY"):
        return TF.affine(image, angle=0.0, translate=[int(m), 0] if op == "TranslateX" else [0, int(m)],
                         scale=1.0, interpolation=nearest, shear=[0.0, 0.0], fill=None)
    if op == "Rotate":
        return TF.rotate(image, angle=m, interpolation=nearest, fill=None)
    if op == "Brightness":
        return TF.adjust_brightness(image, brightness_factor=1.0 + m)
    if op == "Color":
        return TF.adjust_saturation(image, saturation_factor=1.0 + m)
    if op == "Contrast":
        return TF.adjust_contrast(image, contrast_factor=1.0 + m)
    if op == "Sharpness":
        return TF.adjust_sharpness(image, sharpness_factor=1.0 + m)
    if op == "Posterize":
        return TF.posterize(image, bits=int(m))
    if op == "Solarize":
        return TF.solarize(image, threshold=255.0 * m)
    return {"AutoContrast": TF.autocontrast, "Equalize": TF.equalize, "Invert": TF.invert}[op](image)


def only(n: int, policy: int, slot: int, negative: bool) -> AutoAugmentDraws:
    """Draws that apply one op of one sub-policy to each of n images."""
    return AutoAugmentDraws(torch.full((n,), policy), torch.tensor([[slot == 0, slot == 1]]).expand(n, 2),
                            torch.full((n, 2), negative))


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 32, 32), (3, 17, 23)])
def test_each_operation_equals_torchvision_image_by_image(shape):
    """Every op of every sub-policy with either sign, on every image, equals torchvision's functional op
    with the same parameters, exactly: geometric ops (one grid_sample with torchvision's sampling grids),
    blends (its float32 arithmetic), lookup tables (Posterize … Equalize), for 3 and 1 channels and an odd
    size."""
    c, h, w = shape
    images = sample_images(60, c, h, w)
    aa = AutoAugment()
    for policy, sub in enumerate(CIFAR10):
        for slot, (op, _, magnitude_bin) in enumerate(sub):
            for negative in (False, True):
                out = aa.apply(images, only(len(images), policy, slot, negative))
                m = magnitude(op, magnitude_bin, negative, h, w)
                assert out.dtype == torch.uint8 and out.shape == images.shape
                for i, image in enumerate(images):
                    expected = reference_op(image, op, m)
                    assert torch.equal(out[i], expected), (op, m, i, (out[i].int() - expected.int()).abs().max())


def torchvision_with(draws: AutoAugmentDraws, i: int, image: torch.Tensor, policy: AutoAugmentPolicy,
                     monkeypatch) -> torch.Tensor:
    """torchvision's own AutoAugment.forward on image i, its random numbers replaced by draws' for image i
    (its sub-policy; each op applied where rand() <= p: 0 or 1; a signed magnitude negated where
    rand() <= 0.5: 0 or 1)."""
    reference = v2.AutoAugment(policy)
    sub = reference._policies[int(draws.policy[i])]
    uniforms = []
    for slot, (op, _, _) in enumerate(sub):
        applied = bool(draws.applied[i, slot])
        uniforms.append(0.0 if applied else 1.0)
        if applied and SPACE[op][0](10, 32, 32) is not None and SPACE[op][1]:
            uniforms.append(0.0 if draws.negative[i, slot] else 1.0)
    monkeypatch.setattr(torch, "randint", lambda high, size: torch.tensor(int(draws.policy[i])))
    monkeypatch.setattr(torch, "rand", lambda size: torch.tensor(uniforms.pop(0)))
    out = reference(image)
    monkeypatch.undo()
    assert not uniforms
    return out


@pytest.mark.parametrize("policy", [AutoAugmentPolicy.CIFAR10, AutoAugmentPolicy.IMAGENET, AutoAugmentPolicy.SVHN])
def test_whole_subpolicies_equal_torchvision_autoaugment_given_the_same_draws(policy, monkeypatch):
    """Random draws (both ops, either, none) for many images: the batch equals torchvision's AutoAugment
    run image by image with those draws in place of its own random numbers."""
    images = sample_images(1200 if policy == AutoAugmentPolicy.CIFAR10 else 300, seed=1)
    aa = AutoAugment(v2.AutoAugment(policy)._policies)
    draws = aa.draws(len(images), generator=torch.Generator().manual_seed(2))
    if policy == AutoAugmentPolicy.CIFAR10:
        assert torch.equal(autoaugment(images, draws), aa(images, draws))  # the module's CIFAR-10 instance
    out = aa(images, draws)
    for i, image in enumerate(images):
        assert torch.equal(out[i], torchvision_with(draws, i, image, policy, monkeypatch)), i


def test_draws_are_distributed_as_torchvisions():
    """Over 20,000 images: each sub-policy ≈ 1/25, each op applied ≈ its probability, signs ≈ 1/2, within
    5 standard deviations (about 80 checks: a seed fails them with a probability of about 1 in 20,000)."""
    n = 20_000
    draws = autoaugment_draws(n, generator=torch.Generator().manual_seed(3))
    assert draws.policy.dtype == torch.int64 and draws.applied.shape == draws.negative.shape == (n, 2)

    def near(count: torch.Tensor, total: int, p: float) -> bool:
        return abs(float(count) - total * p) <= 5 * math.sqrt(max(total * p * (1 - p), 1.0))

    counts = torch.bincount(draws.policy, minlength=25)
    assert len(counts) == 25 and all(near(k, n, 1 / 25) for k in counts)
    for policy, sub in enumerate(CIFAR10):
        mine = draws.policy == policy
        for slot, (op, p, _) in enumerate(sub):
            applied = draws.applied[mine, slot].sum()
            assert near(applied, int(mine.sum()), p), (policy, op, p, int(applied), int(mine.sum()))
    assert near(draws.negative.sum(), 2 * n, 0.5)
    # independent of one another: the second op's rate does not depend on whether the first applied
    first = draws.applied[:, 0] & (draws.policy == 4)  # (AutoContrast 0.5, Equalize 0.9)
    assert near(draws.applied[first, 1].sum(), int(first.sum()), 0.9)


def test_draws_slice_per_image():
    draws = autoaugment_draws(10, generator=torch.Generator().manual_seed(0))
    part = draws[2:8][1::2]
    assert len(part) == 3 and torch.equal(part.policy, draws.policy[3:8:2])
    assert torch.equal(part.applied, draws.applied[3:8:2]) and torch.equal(part.negative, draws.negative[3:8:2])


# --- random erasing -------------------------------------------------------------------------------------
def timm_with(draws, i: int, image: torch.Tensor, noise: torch.Tensor, probability: float, monkeypatch,
              **options) -> torch.Tensor:
    """timm's own RandomErasing(mode="pixel") on image i, its random numbers replaced by draws' for image i
    (random(): erase; uniform(a, b): a + (b − a)·u, as Python's; randint(0, n): ⌊u·(n + 1)⌋) and its noise by
    the same place of ``noise``."""
    import timm.data.random_erasing as timm_erasing

    attempts = iter(range(draws.area.shape[1]))
    uniforms = []
    placed = []

    def uniform(a, b):
        if not uniforms:  # each try: the area, then the aspect ratio
            k = next(attempts)
            uniforms.extend([float(draws.area[i, k]), float(draws.aspect[i, k])])
        return a + (b - a) * uniforms.pop(0)

    def randint(low, high):
        u = float(draws.top[i] if not placed else draws.left[i])
        placed.append(low + min(int(u * (high - low + 1)), high - low))
        return placed[-1]

    def pixels(per_pixel, rand_color, patch_size, dtype, device):
        c, h, w = patch_size
        top, left = placed
        return noise[i, :, top : top + h, left : left + w]

    fake = SimpleNamespace(random=lambda: float(draws.erase[i]), uniform=uniform, randint=randint)
    monkeypatch.setattr(timm_erasing, "random", fake)
    monkeypatch.setattr(timm_erasing, "_get_pixels", pixels)
    out = timm_erasing.RandomErasing(probability, mode="pixel", device="cpu", **options)(image.clone())
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 20, 28), (3, 6, 5)])
@pytest.mark.parametrize("probability", [0.25, 1.0])
def test_random_erasing_equals_timm_image_by_image_given_the_same_draws(shape, probability, monkeypatch):
    """The same rectangles as timm's loop (first try that fits, Python's round), the same noise in them,
    the rest untouched; an image too small for every try is left as it is."""
    c, h, w = shape
    g = torch.Generator().manual_seed(4)
    x = torch.randn(400, c, h, w, generator=g)
    draws = random_erasing_draws(len(x), generator=g)
    noise = torch.randn(x.shape, generator=g)
    out = erase(x, draws, probability, noise)
    erased = 0
    for i in range(len(x)):
        expected = timm_with(draws, i, x[i], noise, probability, monkeypatch)
        assert torch.equal(out[i], expected), i
        erased += not torch.equal(expected, x[i])
    assert erased > (0.9 if probability == 1 and h > 10 else 0.1) * len(x) * probability
    # other ranges too (timm's keywords)
    options = dict(min_area=0.1, max_area=0.5, min_aspect=0.5, max_aspect=3.0)
    out = erase(x, draws, probability, noise, **options)
    for i in range(0, len(x), 7):
        assert torch.equal(out[i], timm_with(draws, i, x[i], noise, probability, monkeypatch, **options)), i


def test_random_erasing_statistics_agree_with_timm():
    """Over 20,000 images: the fraction erased and the erased area's mean and range agree with timm's own
    RandomErasing (its Python random numbers) within 5 standard errors."""
    from timm.data.random_erasing import RandomErasing

    n, p = 20_000, 0.25
    ours = random_erasing(torch.zeros(n, 1, 32, 32), p, generator=torch.Generator().manual_seed(5))
    random.seed(5)
    theirs = RandomErasing(p, mode="pixel", device="cpu")(torch.zeros(n, 1, 32, 32))
    fractions = [(t != 0).flatten(1).float().mean(1) for t in (ours, theirs)]
    erased = [f[f > 0] for f in fractions]
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(len(erased[0]) / n - p) < 5 * sd and abs(len(erased[1]) / n - p) < 5 * sd
    se = math.sqrt(erased[0].var() / len(erased[0]) + erased[1].var() / len(erased[1]))
    assert abs(erased[0].mean() - erased[1].mean()) < 5 * se
    assert 0.01 < erased[0].min() and erased[0].max() < 0.45  # 2 %–1/3 of the area, rounded to whole sides
    assert abs(erased[0].min() - erased[1].min()) < 0.01 and abs(erased[0].max() - erased[1].max()) < 0.03


def test_erasing_boxes_are_rectangles_inside_the_image():
    draws = random_erasing_draws(2000, generator=torch.Generator().manual_seed(6))
    erased, top, left, h, w = erasing_boxes(draws, 1.0, 32, 24)
    assert erased.all() and (h >= 1).all() and (h < 32).all() and (w < 24).all()
    assert (top >= 0).all() and (top + h <= 32).all() and (left >= 0).all() and (left + w <= 24).all()
    assert top.max() > 20 and left.min() == 0  # the whole range of places
    assert not erasing_boxes(draws, 0.0, 32, 24)[0].any()


def test_random_erasing_leaves_its_input_and_keeps_the_dtype():
    x = torch.randn(8, 3, 16, 16, dtype=torch.bfloat16)
    before = x.clone()
    out = random_erasing(x, 1.0, generator=torch.Generator().manual_seed(7))
    assert out.dtype == torch.bfloat16 and torch.equal(x, before) and not torch.equal(out, x)


# --- batched: a fixed number of operations, no host sync -------------------------------------------------
def profiled(fn) -> tuple[list[str], list[str]]:
    """The aten ops fn runs: all of them, and those called from Python (not from inside another aten op,
    whose internals, e.g. a reduction's buffer fill, vary with the size)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    return [e.name for e in events], [e.name for e in events
                                      if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]


@pytest.mark.parametrize("which", ["autoaugment", "random_erasing"])
def test_no_host_sync_and_as_many_ops_for_8_as_for_64_images(which):
    g = torch.Generator().manual_seed(8)
    aa = AutoAugment()

    def run(n):
        if which == "autoaugment":
            images = sample_images(n)
            return lambda: aa.apply(images, aa.draws(n, generator=g))
        x = torch.randn(n, 3, 32, 32)
        return lambda: random_erasing(x, 0.5, generator=g)

    run(8)()  # the op tables are built on the first batch of a size
    ops = {n: profiled(run(n)) for n in (8, 64)}
    for names, _ in ops.values():
        assert "aten::_local_scalar_dense" not in names and "aten::nonzero" not in names, sorted(set(names))
        assert "aten::item" not in names
    assert ops[8][1] == ops[64][1]  # the same ops in the same order


def test_apply_traces_as_one_graph():
    """torch.compile traces apply and erase whole (fullgraph: no graph break), with the same results."""
    aa = AutoAugment()
    images = sample_images(16)
    draws = aa.draws(16, generator=torch.Generator().manual_seed(9))
    expected = aa.apply(images, draws)  # (builds the op tables for 32×32 images: once, before tracing)
    assert torch.equal(torch.compile(aa.apply, backend="eager", fullgraph=True)(images, draws), expected)
    x = torch.randn(16, 3, 32, 32)
    boxes, noise = random_erasing_draws(16, generator=torch.Generator().manual_seed(9)), torch.randn(16, 3, 32, 32)
    compiled = torch.compile(erase, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x, boxes, 0.5, noise), erase(x, boxes, 0.5, noise))


@pytest.mark.long
@pytest.mark.lowest  # (torch 2.11's Inductor: pyproject.toml)
def test_inductor_compiles_every_op_exactly():
    """Inductor's code (CPU here) gives the same bytes as eager for every op of the policy."""
    aa = AutoAugment()
    images = sample_images(24)
    aa.apply(images, only(len(images), 0, 0, False))  # the op tables, built before tracing
    compiled = torch.compile(aa.apply, fullgraph=True, dynamic=False)
    for policy, sub in enumerate(CIFAR10):
        for slot in range(2):
            for negative in (False, True):
                draws = only(len(images), policy, slot, negative)
                assert torch.equal(compiled(images, draws), aa.apply(images, draws)), (sub[slot], negative)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="uint8 B×C×H×W"):
        autoaugment(torch.rand(2, 3, 8, 8))
