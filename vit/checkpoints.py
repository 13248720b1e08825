"""Reading checkpoints safely: ``torch.load(weights_only=True)`` (a crafted pickle cannot run code),
every failure turned into one CheckpointError that names the file and the reason. Light: torch only."""

from __future__ import annotations

import pickle
from pathlib import Path

from vit.exits import CheckpointError

__all__ = ["CheckpointError", "read_checkpoint"]


def read_checkpoint(path: str | Path) -> dict:
    """A training checkpoint (.ckpt) as a dict, validated to hold a state_dict."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "global" not in str(e).lower():  # not a code reference: just bytes that are no checkpoint
            raise CheckpointError(f"{path}: not a readable checkpoint (corrupt pickle data)") from None
        detail = next((line.strip() for line in str(e).splitlines() if "global" in line.lower()), "")
        raise CheckpointError(f"{path}: refused, the checkpoint references code, not only weights and "
                              f"plain data ({detail})") from None
    except Exception as e:  # noqa: BLE001 - a corrupt file can fail anywhere in torch.load
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: "
                              f"{(str(e).splitlines() or [''])[0].split('. ')[0]})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise CheckpointError(f"{path}: not a vit training checkpoint (no state_dict)")
    return ckpt


def check_fits(ckpt: dict, arch: dict, name: str | None) -> None:
    """A checkpoint whose model does not fit the command line's ``arch``: one line naming the differences."""
    theirs = ckpt.get("hyper_parameters", {}).get("arch", {})
    diff = [f"{k}: checkpoint {theirs[k]!r}, command line {arch[k]!r}" for k in arch
            if k in theirs and k != "num_classes" and theirs[k] != arch[k]]
    if diff:
        raise CheckpointError(f"{name or 'the last checkpoint'}: its model does not fit "
                              f"this command line ({'; '.join(diff)})")
