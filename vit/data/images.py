"""Reading image files: the one loader training, validation, classify and rollout share
(any mode → uint8 RGB, EXIF orientation applied), and a cheap check for whole folders. PIL + torch only."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
MAX_PIXELS = 89_478_485  # PIL's default limit: a larger image is refused as a decompression bomb (PIL's
# own settings, Image.MAX_IMAGE_PIXELS and ImageFile.LOAD_TRUNCATED_IMAGES, are left as the program has them)


class ImageError(ValueError):
    """An image that cannot be read; the message says why."""


@contextmanager
def _open(path: str | Path):
    """PIL image of ``path``, every failure turned into one ImageError."""
    path = Path(path)
    if not path.exists():
        raise ImageError("no such file")
    if path.is_dir():
        raise ImageError("is a directory")
    if path.stat().st_size == 0:
        raise ImageError("empty file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # over MAX_IMAGE_PIXELS: refuse
            with Image.open(path) as im:
                if im.width * im.height > MAX_PIXELS:  # (the header only has been read)
                    raise Image.DecompressionBombError(f"{im.width}×{im.height} = {im.width * im.height:,} pixels, "
                                                       f"over the limit of {MAX_PIXELS:,}")
                yield im
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"refused as a decompression bomb ({e})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageError(f"not a readable image ({e})") from None


def load_image(path: str | Path) -> torch.Tensor:
    """Any mode (1, L, P, RGBA, I;16, ...), first frame of animations, EXIF orientation applied
    (a phone photo stored sideways comes out upright) → uint8 tensor 3×H×W."""
    with _open(path) as im:
        im.seek(0)
        im = ImageOps.exif_transpose(im)
        if im.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit / float greyscale → 8 bits
            arr = np.asarray(im, dtype=np.float64)
            scale = 65535.0 if im.mode.startswith("I;16") or arr.max() > 255 else 255.0
            im = Image.fromarray(np.clip(arr / scale * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
        if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
            im = im.convert("RGBA")
            background = Image.new("RGBA", im.size, (255, 255, 255, 255))  # transparent → white
            im = Image.alpha_composite(background, im)
        rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()


def check_image(path: str | Path) -> str | None:
    """Why ``path`` cannot be trained on, or None. Cheap: the header is parsed and the file's structure
    verified (chunk checksums for PNG); a JPEG is decoded at 1/8 scale (DCT scaling), which reads every
    scan and so finds truncation, at a small fraction of a full decode."""
    try:
        with _open(path) as im:
            if im.format == "JPEG":
                im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
                im.load()
            else:
                im.verify()
    except ImageError as e:
        return str(e)
    return None


def find_images(paths) -> list[Path]:
    """Files as given; directories walked (sorted) for image files."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES))
        else:
            out.append(p)
    return out
