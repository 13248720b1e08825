"""Exports of a trained model: safetensors weights + a JSON sidecar (config, class names, mean/std),
and an ONNX graph."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vit.inference import Classifier, sidecar


def export_safetensors(classifier: Classifier, output: Path) -> list[Path]:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in classifier.model.state_dict().items()}, output)
    sidecar(output).write_text(json.dumps(classifier.meta.to_dict(), indent=2))
    return [output, sidecar(output)]


def export_onnx(classifier: Classifier, output: Path) -> list[Path]:
    """ONNX graph of the network: input ``images`` = normalised float B×C×S×S, output ``logits``."""
    c = classifier.meta.config
    example = torch.randn(2, c.in_channels, c.image_size, c.image_size)
    torch.onnx.export(classifier.model.cpu(), (example,), str(output), input_names=["images"],
                      output_names=["logits"], dynamic_shapes={"images": {0: torch.export.Dim("batch")}},
                      dynamo=True, verbose=False)
    sidecar(output).write_text(json.dumps(classifier.meta.to_dict(), indent=2))
    return [output, sidecar(output)]
