"""AutoAugment and random erasing for a whole batch on the device, with a draw of its own for every image.

torchvision's ``AutoAugment`` and timm's ``RandomErasing`` work image by image in Python (a v2 transform
given a batch draws once for all of it). Here each is a fixed, short sequence of batched tensor operations
with per-image parameters, the same whatever the batch size: no Python loop over the images, no
``.item()``, no boolean-mask indexing (nothing waits for the device), and no graph break under
``torch.compile``. The random numbers are drawn first (``autoaugment_draws``, ``random_erasing_draws``)
and applied after (``AutoAugment.apply``, ``erase``), so a caller can draw for a global batch and apply
its share of it (vit.data.device_data.DeviceBatches), tests can give torchvision and timm the same draws, and
a compiled function can take the draws as inputs (torch.compile does not trace a ``torch.Generator``).

* ``autoaugment(images, draws)`` is torchvision's ``v2.AutoAugment(AutoAugmentPolicy.CIFAR10)`` (nearest
  interpolation, fill 0) on a uint8 B×C×H×W batch: each image gets one of the policy's 25 sub-policies,
  each of its two operations applied with its probability, a signed magnitude negated half of the time.
  For the same draws the result equals torchvision's, image by image and bit for bit
  (tests/test_device_augment.py); ``AutoAugment(policy)`` does the same for another table of sub-policies
  (torchvision's ImageNet and SVHN ones are tested too).
* ``random_erasing(x, probability, generator)`` is timm's ``RandomErasing(probability, mode="pixel")`` on
  a float normalised B×C×H×W batch: each image, with that probability, gets one rectangle (2 %–1/3 of its
  area, aspect ratio 0.3–3.3, log-uniform; the first of 10 tries that fits) of standard normal noise.
  Unlike timm's, it returns a new tensor and leaves x as it is.

    draws = autoaugment_draws(len(images), images.device, generator)
    images = autoaugment(images, draws)
    x = random_erasing(x, 0.25, generator)
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

__all__ = ["CIFAR10_POLICY", "AutoAugment", "AutoAugmentDraws", "ErasingDraws", "autoaugment", "autoaugment_draws",
           "erase", "erasing_boxes", "magnitudes", "random_erasing", "random_erasing_draws"]

# torchvision's AutoAugmentPolicy.CIFAR10: 25 sub-policies of two (op, probability, magnitude bin) each
# (torchvision keeps the table in a private attribute; tests/test_device_augment.py holds this copy equal)
CIFAR10_POLICY = (
    (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
    (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
    (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
    (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
    (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
    (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
    (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
    (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
    (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
    (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
    (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
    (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
    (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
    (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
    (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
    (("Color", 0.9, 9), ("Equalize", 0.6, None)),
    (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
    (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
    (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
    (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
    (("Equalize", 0.8, None), ("Invert", 0.1, None)),
    (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
)
SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"}


def magnitudes(op: str, h: int, w: int, bins: int = 10) -> torch.Tensor | None:
    """torchvision's AutoAugment magnitude bins of op for an H×W image (its augmentation space, which it
    keeps private; tests/test_device_augment.py holds these equal); None for an op without a magnitude."""
    if op == "Posterize":
        return (8 - (torch.arange(bins) / ((bins - 1) / 4))).round().int()
    if op == "Solarize":
        return torch.linspace(1.0, 0.0, bins)
    top = {"ShearX": 0.3, "ShearY": 0.3, "TranslateX": 150.0 / 331.0 * w, "TranslateY": 150.0 / 331.0 * h,
           "Rotate": 30.0, "Brightness": 0.9, "Color": 0.9, "Contrast": 0.9, "Sharpness": 0.9}.get(op)
    return None if top is None else torch.linspace(0.0, top, bins)

GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
# What an operation is, for the batched passes. Pixel-value operations are per-image, per-channel lookup
# tables of the 256 values (one gather applies any of them); Color and Sharpness blend each pixel with
# its grey value or its neighbours; the geometric ones resample.
_PLAIN, _BRIGHTNESS, _CONTRAST, _AUTOCONTRAST, _EQUALIZE, _COLOR, _SHARPNESS, _GEOMETRIC = range(8)
_KINDS = {"Brightness": _BRIGHTNESS, "Contrast": _CONTRAST, "AutoContrast": _AUTOCONTRAST, "Equalize": _EQUALIZE,
          "Color": _COLOR, "Sharpness": _SHARPNESS, **dict.fromkeys(GEOMETRIC, _GEOMETRIC),
          **dict.fromkeys(("Identity", "Posterize", "Solarize", "Invert"), _PLAIN)}
_ONE_255TH = struct.unpack("f", struct.pack("f", 1.0 / 255))[0]  # F.autocontrast's float32 1/255


class _Draws:
    """Per-image draws, one tensor per field with images first: indexing selects images, len counts them."""

    def __getitem__(self, index):
        return type(self)(*(getattr(self, f.name)[index] for f in fields(self)))

    def __len__(self) -> int:
        return len(getattr(self, fields(self)[0].name))


@dataclass(frozen=True)
class AutoAugmentDraws(_Draws):
    """The random choices of AutoAugment for n images: ``policy`` (n, int64) the sub-policy of each,
    ``applied`` (n×2, bool) whether each of its two operations applies, ``negative`` (n×2, bool) whether a
    signed operation's magnitude is negated. Indexing (``draws[a:b]``, ``draws[rank::world]``) selects
    images."""

    policy: torch.Tensor
    applied: torch.Tensor
    negative: torch.Tensor


# --- torchvision's geometry, copied so the grids are its grids ---------------------------------------
def _inverse_affine_matrix(center, angle, translate, scale, shear) -> list[float]:
    """torchvision.transforms.v2.functional._geometry._get_inverse_affine_matrix (inverted=True)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    (cx, cy), (tx, ty) = center, translate
    cos_sy, tan_sx, rot_minus_sy = math.cos(sy), math.tan(sx), rot - sy
    a = math.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot_minus_sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    matrix = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    matrix[2] += cx - matrix[0] * (cx + tx) - matrix[1] * (cy + ty)
    matrix[5] += cy - matrix[3] * (cx + tx) - matrix[4] * (cy + ty)
    return matrix


def _affine_grid(matrix: list[float], h: int, w: int, device="cpu") -> torch.Tensor:
    """The 1×H×W×2 sampling grid torchvision's affine/rotate build for a uint8 image (its _affine_grid:
    the same float32 operations)."""
    theta = torch.tensor(matrix, dtype=torch.float32, device=device).reshape(1, 2, 3)
    base = torch.empty(1, h, w, 3, dtype=torch.float32, device=device)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=device))
    base[..., 1].copy_(torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=device).unsqueeze_(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2).div_(torch.tensor([0.5 * w, 0.5 * h], dtype=torch.float32, device=device))
    return base.view(1, h * w, 3).bmm(rescaled).view(1, h, w, 2)


def _geometry(op: str, magnitude: float, h: int, w: int) -> list[float]:
    """The inverse affine matrix of AutoAugment's op with this (signed) magnitude, as torchvision's
    AutoAugment computes it (v2 _AutoAugmentBase._apply_image_or_video_transform → F.affine / F.rotate)."""
    if op in ("ShearX", "ShearY"):  # about the top-left corner: center=[0, 0] in pixels
        shear = math.degrees(math.atan(magnitude))
        return _inverse_affine_matrix([-w * 0.5, -h * 0.5], 0.0, [0.0, 0.0], 1.0,
                                      [shear, 0.0] if op == "ShearX" else [0.0, shear])
    if op in ("TranslateX", "TranslateY"):
        shift = [float(int(magnitude)), 0.0] if op == "TranslateX" else [0.0, float(int(magnitude))]
        return _inverse_affine_matrix([0.0, 0.0], 0.0, shift, 1.0, [0.0, 0.0])
    angle = magnitude % 360  # F.rotate; its exact fast paths (rot90) are not among AutoAugment's angles
    if angle in (90, 180, 270):
        raise ValueError(f"AutoAugment rotation by {angle}° is not supported here")
    return _inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0])


@dataclass(frozen=True)
class _Tables:
    """Per-(sub-policy, slot, sign) parameters of the operations for one image size on one device; the
    last row is an operation that is not applied."""

    grids: torch.Tensor  # G×H×W×2 float32 sampling grids (row 0: the identity)
    ints: torch.Tensor  # rows × 3 int64: kind, grid row, posterize bit mask
    # rows × 5 float64 (float32 values): Brightness/Contrast ratio and alpha, solarize threshold,
    # Color/Sharpness ratio and alpha (1 and 0: unchanged)
    floats: torch.Tensor


class AutoAugment:
    """torchvision's ``v2.AutoAugment`` (interpolation nearest, fill 0) on a uint8 B×C×H×W batch, each image
    with its own draws, in a fixed number of batched operations. ``policy``: its sub-policies, pairs of
    (op, probability, magnitude bin) as torchvision writes them (CIFAR-10's by default).

    ``draws(n, device, generator)`` makes the random choices of n images; ``apply(images, draws)`` applies
    them (equal, image by image, to torchvision's AutoAugment making the same choices); ``aa(images,
    generator=g)`` does both. The op tables (sampling grids, blend factors) are built once per image size
    and device, on the first batch of that size: before ``torch.compile(..., fullgraph=True)`` traces
    ``apply``, call it once eagerly (or ``tables(h, w, device)``)."""

    def __init__(self, policy=CIFAR10_POLICY):
        self.subpolicies = tuple(tuple(sub) for sub in policy)
        self.probabilities = torch.tensor([[p for _, p, _ in sub] for sub in self.subpolicies], dtype=torch.float32)
        self._tables: dict[tuple, _Tables] = {}
        self._probabilities = {str(self.probabilities.device): self.probabilities}  # a copy on each device

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.subpolicies)} sub-policies)"

    def draws(self, n: int, device: torch.device | str | None = None,
              generator: torch.Generator | None = None) -> AutoAugmentDraws:
        """n images' sub-policies (uniform), whether each operation applies (``u <= probability``, as
        torchvision draws it) and the magnitudes' signs (negated where ``u <= 0.5``). Three draws from
        ``generator``: n integers, then 2n and 2n uniform numbers."""
        policy = torch.randint(0, len(self.subpolicies), (n,), device=device, generator=generator)
        u = torch.rand(n, 2, device=device, generator=generator)
        negative = torch.rand(n, 2, device=device, generator=generator) <= 0.5
        probabilities = self._probabilities.get(str(u.device))
        if probabilities is None:
            probabilities = self._probabilities[str(u.device)] = self.probabilities.to(u.device)
        return AutoAugmentDraws(policy, u <= probabilities[policy], negative)

    def magnitude(self, op: str, magnitude_bin: int | None, negative: bool, h: int, w: int) -> float:
        """The magnitude torchvision's AutoAugment gives op at this bin (for an H×W image), signed."""
        bins = magnitudes(op, h, w)
        if bins is None:
            return 0.0
        magnitude = float(bins[magnitude_bin])
        return -magnitude if op in SIGNED and negative else magnitude

    def tables(self, h: int, w: int, device: torch.device) -> _Tables:
        """The op tables of H×W images on ``device`` (built on first use, then kept)."""
        key = (h, w, str(torch.device(device)))
        if key not in self._tables:
            self._tables[key] = self._build(h, w, torch.device(device))
        return self._tables[key]

    def _build(self, h: int, w: int, device: torch.device) -> _Tables:
        # on the CPU, as torchvision computes them in DataLoader workers, then copied to the device: the same
        # tables (sampling grids to the last bit) on every device
        grids = [_affine_grid([1.0, 0.0, 0.0, 0.0, 1.0, 0.0], h, w)]  # row 0: images that are not moved
        ints, floats = [], []
        for sub in self.subpolicies:
            for op, _, magnitude_bin in sub:
                for negative in (False, True):
                    if op not in _KINDS:
                        raise ValueError(f"AutoAugment op {op} is not supported here")
                    m = self.magnitude(op, magnitude_bin, negative, h, w)
                    kind, grid, mask, ratio, threshold = _KINDS[op], 0, 255, 1.0, 256.0
                    if kind == _GEOMETRIC:
                        grid = len(grids)
                        grids.append(_affine_grid(_geometry(op, m, h, w), h, w))
                    elif kind in (_BRIGHTNESS, _CONTRAST, _COLOR, _SHARPNESS):
                        ratio = 1.0 + m
                        if ratio < 0:
                            raise ValueError(f"{op} factor {ratio} is negative")
                    elif op == "Posterize":
                        bits = int(m)
                        mask = 255 if bits >= 8 else ((1 << bits) - 1) << (8 - bits)
                    elif op == "Solarize":
                        threshold = 255.0 * m  # F.solarize compares the uint8 values with it in float32
                    elif op == "Invert":
                        threshold = 0.0  # solarizing at 0 inverts every value, as bitwise_not does
                    # _blend: x·float32(ratio) + other·float32(1.0 − ratio);
                    # Sharpness: x + float32(1.0 − ratio)·(blur − x)
                    blend = [_float32(1.0 if kind == _SHARPNESS else ratio), _float32(1.0 - ratio)]
                    ints.append([kind, grid, mask])
                    floats.append([*(blend if kind in (_BRIGHTNESS, _CONTRAST) else [1.0, 0.0]), _float32(threshold),
                                   *(blend if kind in (_COLOR, _SHARPNESS) else [1.0, 0.0])])
        ints.append([_PLAIN, 0, 255])  # the identity row: an operation that is not applied
        floats.append([1.0, 0.0, 256.0, 1.0, 0.0])
        return _Tables(torch.cat(grids).to(device), torch.tensor(ints, device=device),
                       torch.tensor(floats, dtype=torch.float64, device=device))

    def apply(self, images: torch.Tensor, draws: AutoAugmentDraws) -> torch.Tensor:
        """uint8 B×C×H×W (C 1 or 3) → uint8 B×C×H×W: each image's sub-policy, its two operations in
        order, each where ``draws.applied``."""
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] not in (1, 3):
            raise ValueError(f"AutoAugment takes uint8 B×C×H×W batches with 1 or 3 channels, got "
                             f"{images.dtype} {tuple(images.shape)}")
        b, c, h, w = images.shape
        tables = self.tables(h, w, images.device)
        identity = tables.ints.shape[0] - 1
        for slot in range(2):  # every image has at most one operation in each pass
            row = torch.where(draws.applied[:, slot], draws.policy * 4 + 2 * slot + draws.negative[:, slot].long(),
                              identity)
            images = _one_op_each(images, tables, row)
        return images

    def __call__(self, images: torch.Tensor, draws: AutoAugmentDraws | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        if draws is None:
            draws = self.draws(len(images), images.device, generator)
        return self.apply(images, draws)


def _float32(value: float) -> float:
    """The float32 nearest to value (as a Python float)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _one_op_each(x: torch.Tensor, tables: _Tables, row: torch.Tensor) -> torch.Tensor:
    """Image i gets the operation of table row row[i] (the identity row: none), in torchvision's float32
    arithmetic. Three batched stages, each with per-image parameters that leave an image unchanged unless
    its operation is of that stage: the pixel-value operations as a lookup table of the 256 values, then
    Color and Sharpness, then the geometric operations."""
    b, c, h, w = x.shape
    kind, grid, mask = tables.ints[row].view(b, 3, 1, 1).unbind(1)  # B×1×1 each
    ratio, alpha, threshold, mix_ratio, mix_alpha = tables.floats[row].view(b, 5, 1, 1).unbind(1)
    xf = x.float()
    if c == 3:  # F.rgb_to_grayscale's float32 arithmetic, floored as for uint8 images
        red, green, blue = xf.unbind(1)
        gray = red.mul(0.2989).add_(green, alpha=0.587).add_(blue, alpha=0.114).unsqueeze(1).floor_()
    else:  # torchvision's Color leaves one channel as it is, and its Contrast takes the image's own mean
        gray = xf
        mix_alpha = torch.where(kind == _COLOR, 0.0, mix_alpha)
        mix_ratio = torch.where(kind == _COLOR, 1.0, mix_ratio)

    # 1. Each image's B×C×256 lookup table: Posterize (bit mask), Solarize and Invert (threshold), then
    # Brightness and Contrast (x·ratio + alpha·(0 or the mean grey value), the fused multiply-add of
    # torchvision's add(alpha=), exact in float64 here), or AutoContrast, or Equalize (per channel).
    values = torch.arange(256, device=x.device, dtype=torch.uint8)
    posterized = values & mask.to(torch.uint8)
    plain = torch.where(posterized >= threshold.float(), ~posterized, posterized)
    mean = torch.where(kind == _CONTRAST, gray.mean((1, 2, 3)).view(b, 1, 1), 0.0)
    lut = torch.addcmul((plain * ratio).float(), mean, alpha).float().clamp_(0, 255).to(torch.uint8)
    # AutoContrast: float32((v − low) / float32((high − low)·float32(1/255))): the product in float32 (of
    # an integer and a float32: correctly rounded anywhere), the quotient correctly rounded in float64 and
    # rounded once to float32 (a GPU's float32 division is not correctly rounded), so equal to float32
    # arithmetic whatever a compiler makes of it (no float32 rounding of a float64 value, which Inductor
    # of torch 2.11 leaves out); a constant channel is kept. (The minimum of the float32 copy: Inductor's
    # CPU code takes uint8 minima as 0, pytorch/pytorch#191499.)
    low, high = xf.amin((-2, -1)).unsqueeze(-1), xf.amax((-2, -1)).unsqueeze(-1)  # B×C×1
    flat = high == low
    scale = torch.where(flat, 1.0, (high - low) * _ONE_255TH).double()
    stretched = ((values - torch.where(flat, 0.0, low)).double() / scale).float()
    index = x.reshape(b, c, h * w).long()
    lut = torch.where(kind == _AUTOCONTRAST, stretched.clamp_(0, 255).to(torch.uint8),
                      torch.where(kind == _EQUALIZE, _equalize_lut(index), lut))
    y = lut.expand(b, c, 256).gather(2, index).view(b, c, h, w)

    # 2. Color and Sharpness: float32(y·ratio) + alpha·other per pixel (y is x where alpha is not 0), other
    # the grey value or, inside the border, the rounded 3×3 smoothing minus the pixel (Sharpness: ratio 1).
    # The smoothing (1/13, centre 5/13) of integers is (S + 4·centre)/13, S the 3×3 sum: never within 1/26
    # of a half, so rounding it gives torchvision's rounded float32 convolution, however it is summed; and
    # round((S + 4c)/13) − c = round((S − 9c)/13).
    other = gray
    if h > 2 and w > 2:  # (torchvision leaves smaller images as they are)
        rows = xf[..., :-2, :] + xf[..., 1:-1, :] + xf[..., 2:, :]
        sums = rows[..., :-2] + rows[..., 1:-1] + rows[..., 2:]
        detail = F.pad(sums.sub_(xf[..., 1:-1, 1:-1], alpha=9).div_(13).round_(), (1, 1, 1, 1))
        other = torch.where((kind == _COLOR).unsqueeze(1), gray, detail)
    else:
        mix_alpha = torch.where(kind == _SHARPNESS, 0.0, mix_alpha)
    scaled = y.float().mul_(mix_ratio.unsqueeze(1).float())  # torchvision's float32 product
    mixed = torch.addcmul(scaled.double(), other.double(), mix_alpha.unsqueeze(1))  # the fma, exact in float64
    z = mixed.float().clamp_(0, 255).trunc_()  # what .to(uint8) keeps

    # 3. ShearX/Y, TranslateX/Y, Rotate: one grid_sample (nearest, zeros), each image with its grid
    return F.grid_sample(z, tables.grids[grid.reshape(b)], mode="nearest", padding_mode="zeros",
                         align_corners=False).to(torch.uint8)


def _equalize_lut(index: torch.Tensor) -> torch.Tensor:
    """B×C×256 uint8: torchvision's F.equalize as a lookup table of each channel (B×C×N values, int64)."""
    hist = torch.zeros(index.shape[:-1] + (256,), dtype=torch.int32, device=index.device)
    hist.scatter_add_(-1, index, hist.new_ones(1).expand_as(index))
    cum_hist = hist.cumsum(-1)
    # PIL's step: the pixels that are not the channel's largest value, over 255
    step = (index.shape[-1] - hist.gather(-1, cum_hist.argmax(-1, keepdim=True))).div_(255, rounding_mode="floor")
    lut = (cum_hist[..., :-1] + step // 2).div_(step.clamp(min=1), rounding_mode="floor").clamp_(0, 255)
    lut = torch.cat([torch.zeros_like(step), lut], -1).to(torch.uint8)
    identity = torch.arange(256, device=index.device, dtype=torch.uint8)
    return torch.where(step != 0, lut, identity)


_CIFAR10 = AutoAugment(CIFAR10_POLICY)


def autoaugment_draws(n: int, device: torch.device | str | None = None,
                      generator: torch.Generator | None = None) -> AutoAugmentDraws:
    """The random choices of CIFAR-10-policy AutoAugment for n images (``AutoAugment.draws``)."""
    return _CIFAR10.draws(n, device, generator)


def autoaugment(images: torch.Tensor, draws: AutoAugmentDraws | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """torchvision's CIFAR-10-policy AutoAugment on a uint8 B×C×H×W batch, per image (``AutoAugment``):
    with ``draws`` if given, else drawn from ``generator``."""
    return _CIFAR10(images, draws, generator)


# --- random erasing -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ErasingDraws(_Draws):
    """The uniform numbers timm's RandomErasing draws for n images, in [0, 1): ``erase`` (n; the image
    is erased where ``erase <= probability``), ``area`` and ``aspect`` (n×attempts; each try's share of the
    area range and of the log aspect-ratio range), ``top`` and ``left`` (n; where the rectangle goes among
    the places it fits). Indexing selects images."""

    erase: torch.Tensor
    area: torch.Tensor
    aspect: torch.Tensor
    top: torch.Tensor
    left: torch.Tensor


def random_erasing_draws(n: int, device: torch.device | str | None = None,
                         generator: torch.Generator | None = None, attempts: int = 10) -> ErasingDraws:
    """n images' random-erasing draws (float64 uniforms, so the rectangle sizes are timm's double-precision
    arithmetic): one tensor of n×(2·attempts + 3) from ``generator``."""
    u = torch.rand(n, 2 * attempts + 3, dtype=torch.float64, device=device, generator=generator)
    return ErasingDraws(u[:, 0], u[:, 1 : attempts + 1], u[:, attempts + 1 : 2 * attempts + 1],
                        u[:, -2], u[:, -1])


def erasing_boxes(draws: ErasingDraws, probability: float, height: int, width: int, min_area: float = 0.02,
                  max_area: float = 1 / 3, min_aspect: float = 0.3, max_aspect: float | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(erased, top, left, h, w) per image, as timm's ``RandomErasing._erase`` (count 1) finds them: each try
    a target area uniform in [min_area, max_area] of the image and an aspect ratio log-uniform in
    [min_aspect, max_aspect]; the first try whose rounded rectangle is smaller than the image in both sides
    is placed uniformly where it fits; an image no try fits is left as it is."""
    log_low, log_high = math.log(min_aspect), math.log(max_aspect or 1 / min_aspect)
    target = (min_area + (max_area - min_area) * draws.area) * (height * width)
    aspect = torch.exp(log_low + (log_high - log_low) * draws.aspect)
    hs, ws = torch.sqrt(target * aspect).round().long(), torch.sqrt(target / aspect).round().long()
    fits = (hs < height) & (ws < width)
    first = fits.byte().argmax(1, keepdim=True)  # the first try that fits (0 when none does: not erased)
    erased = (draws.erase <= probability) & fits.any(1)
    h, w = hs.gather(1, first).squeeze(1), ws.gather(1, first).squeeze(1)
    top = (draws.top * (height - h + 1)).long().clamp_(max=height - h)  # randint(0, height - h)
    left = (draws.left * (width - w + 1)).long().clamp_(max=width - w)
    return erased, top, left, h, w


def erase(x: torch.Tensor, draws: ErasingDraws, probability: float, noise: torch.Tensor | None = None,
          generator: torch.Generator | None = None, **ranges) -> torch.Tensor:
    """x (B×C×H×W, float) with each image's rectangle (``erasing_boxes``; ``ranges``: its area and aspect
    keywords) replaced by ``noise`` (B×C×H×W; by default standard normal from ``generator``). A new tensor:
    x is not changed."""
    b, c, height, width = x.shape
    erased, top, left, h, w = erasing_boxes(draws, probability, height, width, **ranges)
    if noise is None:
        noise = torch.randn(x.shape, dtype=x.dtype, device=x.device, generator=generator)
    rows = torch.arange(height, device=x.device) - top[:, None]  # B×H, inside where 0 <= · < h
    cols = torch.arange(width, device=x.device) - left[:, None]
    inside = ((rows >= 0) & (rows < h[:, None]))[:, :, None] & ((cols >= 0) & (cols < w[:, None]))[:, None, :]
    return torch.where((inside & erased[:, None, None]).unsqueeze(1), noise, x)


def random_erasing(x: torch.Tensor, probability: float, generator: torch.Generator | None = None,
                   **ranges) -> torch.Tensor:
    """timm's ``RandomErasing(probability, mode="pixel")`` on a float normalised B×C×H×W batch, per image:
    draws (``random_erasing_draws``), then the noise, from ``generator``; returns a new tensor."""
    draws = random_erasing_draws(x.shape[0], x.device, generator)
    return erase(x, draws, probability, generator=generator, **ranges)
