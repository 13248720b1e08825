"""Reading any common image file into the uint8 RGB tensor the models see. Light: PIL + torch only."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFile

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
Image.MAX_IMAGE_PIXELS = 89_478_485  # PIL's default: larger is refused as a decompression bomb
ImageFile.LOAD_TRUNCATED_IMAGES = False


class ImageError(ValueError):
    """An image that cannot be read; the message says why."""


def load_image(path: str | Path) -> torch.Tensor:
    """Any mode (1, L, P, RGBA, I;16, ...), first frame of animations → uint8 tensor 3×H×W."""
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
            im = Image.open(path)
        with im:
            im.seek(0)
            if im.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit / float greyscale → 8 bits
                arr = np.asarray(im, dtype=np.float64)
                scale = 65535.0 if im.mode.startswith("I;16") or arr.max() > 255 else 255.0
                im = Image.fromarray(np.clip(arr / scale * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
            if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                im = im.convert("RGBA")
                background = Image.new("RGBA", im.size, (255, 255, 255, 255))  # transparent → white
                im = Image.alpha_composite(background, im)
            rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"refused as a decompression bomb ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"not a readable image ({e})") from None
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()


def find_images(paths) -> list[Path]:
    """Files as given; directories walked (sorted) for image files."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES))
        else:
            out.append(p)
    return out
