"""Exports of a trained model: safetensors weights + a JSON sidecar (config, class names, mean/std),
and an ONNX graph."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vit.inference.classifier import Classifier, sidecar


def export_safetensors(classifier: Classifier, output: Path) -> list[Path]:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in classifier.model.state_dict().items()}, output)
    sidecar(output).write_text(json.dumps(classifier.meta.to_dict(), indent=2))
    return [output, sidecar(output)]


def export_onnx(classifier: Classifier, output: Path) -> list[Path]:
    """One self-contained ONNX file: input ``images`` = uint8 B×C×S×S (resized as in vit.models.preprocessing),
    normalised inside the graph; output ``logits``; class names, mean/std and the config in its metadata.
    No sidecar is needed (and none is written, so it never overwrites the safetensors export's)."""
    import onnx

    c = classifier.meta.config
    graph = torch.nn.Sequential(classifier.normalize, classifier.model).cpu().eval()
    example = torch.randint(0, 256, (2, c.in_channels, c.image_size, c.image_size), dtype=torch.uint8)
    program = torch.onnx.export(graph, (example,), input_names=["images"], output_names=["logits"],
                                dynamic_shapes=({0: torch.export.Dim("batch")},), dynamo=True,
                                verbose=False)
    model = program.model_proto
    onnx.helper.set_model_props(model, {"vit": json.dumps(classifier.meta.to_dict()),
                                        "class_names": json.dumps(classifier.meta.class_names)})
    onnx.save_model(model, str(output), save_as_external_data=False)
    return [output]
