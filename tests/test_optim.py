"""vit.training.optim.Muon: timm's Muon step, batched — the same numbers, the same state, far fewer ops."""

import copy
import io
from collections import Counter
from functools import partial
from unittest import mock

import pytest
import timm.optim.muon as timm_muon
import torch
from torch.profiler import ProfilerActivity, profile

from vit.training.module import ViTClassifier
from vit.training.optim import Muon

SMALL = dict(image_size=16, patch_size=4, dim=32, depth=2, heads=4, mlp_ratio=2.0)  # 4 matrix shapes per block
DEFAULT = dict(image_size=32, patch_size=4, dim=192, depth=9, heads=12, mlp_ratio=2.0)  # the default recipe's
LR, MUON_LR = 1e-3, 2e-3


@pytest.fixture(autouse=True)
def one_thread():
    """One thread (conftest restores the count): small matrix products on two busy cores wait on each other."""
    torch.set_num_threads(1)


def twins(arch: dict) -> tuple[ViTClassifier, ViTClassifier]:
    torch.manual_seed(0)
    a = ViTClassifier(arch=arch, optimizer={"name": "muon", "weight_decay": 0.1})
    return a, copy.deepcopy(a)


def timms(module: ViTClassifier, **options) -> timm_muon.Muon:
    return timm_muon.Muon(module.param_groups(LR, MUON_LR), lr=MUON_LR, **options)


def ours(module: ViTClassifier, **options) -> Muon:
    return Muon(module.param_groups(LR, MUON_LR), lr=MUON_LR, ns_dtype=torch.float32, **options)


def step(optimizer) -> None:
    """Our step, or timm's with its Newton–Schulz iteration in float32 (timm's module function patched)."""
    if isinstance(optimizer, Muon):
        optimizer.step()
        return
    float32 = partial(timm_muon.zeropower_via_newtonschulz, dtype=torch.float32)
    with mock.patch.object(timm_muon, "zeropower_via_newtonschulz", float32):
        optimizer.step()


def set_gradients(*modules: ViTClassifier, seed: int) -> None:
    """The same random gradient on each module's copy of a parameter."""
    generator = torch.Generator().manual_seed(seed)
    for copies in zip(*(m.parameters() for m in modules)):
        gradient = torch.randn(copies[0].shape, generator=generator)
        for p in copies:
            p.grad = gradient.clone()


def assert_same_weights(a: ViTClassifier, b: ViTClassifier) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("options", [{}, {"nesterov": True}], ids=["default", "nesterov"])
def test_the_step_is_timms(options):
    a, b = twins(SMALL)
    start = [p.clone() for p in a.parameters()]
    reference, batched = timms(a, **options), ours(b, **options)
    assert reference.param_groups[0]["weight_decay"] > 0
    for n in range(20):
        set_gradients(a, b, seed=n)
        step(reference)
        step(batched)
    assert_same_weights(a, b)
    for (name, p), p0 in zip(a.named_parameters(), start):
        assert (p - p0).abs().max() > 1e-4, f"{name} did not move"


def test_a_checkpoint_of_either_resumes_in_the_other():
    a, b = twins(SMALL)
    reference, batched = timms(a), ours(b)
    for n in range(3):
        set_gradients(a, b, seed=n)
        step(reference)
        step(batched)
    for x, y in zip(reference.state_dict()["state"].values(), batched.state_dict()["state"].values()):
        assert {k: (v.dtype, v.shape, v.device) if torch.is_tensor(v) else v for k, v in x.items()} == \
               {k: (v.dtype, v.shape, v.device) if torch.is_tensor(v) else v for k, v in y.items()}

    def saved(optimizer) -> dict:
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        buffer.seek(0)
        return torch.load(buffer)

    c, d = copy.deepcopy(a), copy.deepcopy(b)
    batched_from_timm, timm_from_batched = ours(c), timms(d)
    batched_from_timm.load_state_dict(saved(reference))
    timm_from_batched.load_state_dict(saved(batched))
    for n in range(3, 6):
        set_gradients(a, b, c, d, seed=n)
        for optimizer in (reference, batched, batched_from_timm, timm_from_batched):
            step(optimizer)
    assert_same_weights(a, c)
    assert_same_weights(b, d)
    assert_same_weights(a, b)


def test_what_it_does_not_batch_is_timms_step_in_bfloat16_only():
    a, b = twins(SMALL)
    set_gradients(a, b, seed=0)
    with pytest.raises(ValueError, match="ns_dtype=torch.bfloat16"):
        ours(a, algo="adamuon").step()
    reference = timms(a, algo="adamuon")
    batched = Muon(b.param_groups(LR, MUON_LR), lr=MUON_LR, algo="adamuon")  # bfloat16: timm's step itself
    reference.step()
    batched.step()
    assert_same_weights(a, b)


def ops(optimizer) -> tuple[Counter, int]:
    """Every aten op of one step after two, and how many of them are top-level (not inside another aten op)."""
    step(optimizer)
    step(optimizer)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(optimizer)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    return Counter(e.name for e in events), len(top)


def test_the_step_is_a_few_ops_with_no_read_of_a_scalar():
    a, b = twins(DEFAULT)
    set_gradients(a, b, seed=0)
    reference, batched = timms(a), ours(b)
    _, timm_top = ops(reference)
    counts, top = ops(batched)
    assert counts["aten::_local_scalar_dense"] == 0
    shapes = {p.shape for p in batched.param_groups[0]["params"]}
    products = sum(counts[f"aten::{name}"] for name in ("addmm", "baddbmm", "bmm", "mm"))
    assert products <= len(shapes) * 3 * batched.param_groups[0]["ns_steps"] + 2
    assert top <= timm_top / 3, (top, timm_top)


TINY = dict(image_size=16, patch_size=4, dim=16, depth=1, heads=2, mlp_ratio=2.0)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=[pytest.mark.long, pytest.mark.lowest])], ids=["eager", "compiled"])
def test_the_step_takes_the_norm_clips_and_is_timms_at_a_changing_lr(compiled):
    """The step with clipping (max_norm) as the recipe runs it: the gradients' norm is torch's, they are clipped
    as clip_grad_norm_ clips them, then the update is timm's, at an lr that changes every step as timm's
    scheduler changes it (a float in each group). Compiled: four graphs (the norm and clipping, Muon's update,
    AdamW's of each of two groups), compiled at the first step and never again (the lr reaches them as a value,
    not as a constant they are compiled for), with no graph break and no read on the host, equal to timm's within
    float rounding."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    a, b = twins(TINY if compiled else SMALL)
    reference, batched = timms(a), ours(b, compiled=compiled, max_norm=1.0)
    for n in range(4):
        for optimizer in (reference, batched):
            for group in optimizer.param_groups:
                group["lr"] = (LR if group.get("use_fallback") else MUON_LR) * (n + 1) / 4
        set_gradients(a, b, seed=n)
        expected = torch.nn.utils.clip_grad_norm_(list(a.parameters()), 1.0)
        step(reference)
        step(batched)
        torch.testing.assert_close(batched.grad_norm, expected)
        assert expected > 2  # (the gradients were clipped: a step that did not clip would not be timm's)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert graphs == (4 if compiled else 0)
    assert_same_weights(a, b)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # nothing read on the host, the lr included
        step(batched)
    assert not [e for e in prof.events() if e.name == "aten::_local_scalar_dense"]
