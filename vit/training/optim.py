"""timm's Muon with a batched step, and its Newton–Schulz iteration in a dtype of our choice (``ns_dtype``).

The optimizer is timm's Muon: its parameter routing (Muon for the matrices, AdamW for the groups flagged
``use_fallback`` and for what timm finds unsuited), its lr scaling and its state, key for key, so that a
checkpoint of either one resumes in the other. Its step does the same arithmetic in fewer, larger ops:

- each element-wise update (weight decay, momentum, Adam's moments) is one ``torch._foreach_*`` op over the
  parameter group, instead of one op per tensor;
- the matrices of one shape (up to transposition: timm orthogonalises a tall matrix as its transpose) are
  stacked into one batch and orthogonalised by one call of timm's ``zeropower_via_newtonschulz`` (5 iterations
  of 3 batched matrix products), instead of one call per matrix;
- the AdamW fallback reads its step counts (CPU tensors, as timm keeps them) once per group, where timm reads
  each parameter's with ``.item()``.

On a GPU an op is one kernel launch or a few: for the default model (36 matrices in 3 batches, 80 other
tensors) the step orthogonalises with 45 batched products where timm's runs 540, its AdamW takes a dozen
foreach ops where timm's runs several per tensor (torch's profiler counts them: docs/speed.md), and none of its
ops waits on the GPU. The numbers are those of timm's step (tests/test_optim.py compares them in
float32 on a CPU: equal to the bit).

Where a group is one this step does not batch — algo "adamuon", capturable, a tensor lr, a Muon parameter
that is not a plain 2-D matrix (a convolution, a DTensor), a complex parameter — the whole step is timm's own,
whose Newton–Schulz iteration is bfloat16: with another ``ns_dtype`` the step raises ValueError. timm's
``verbose`` routing log is not printed.

``ns_dtype``: bfloat16 on a GPU, its fast path; float32 on a CPU, where bfloat16 matrix products are emulated
on most chips (an AMD EPYC Milan, most laptops) and cost the cpu recipe a large share of its steps (the
benchmark's fast-paths section measures it: docs/results.md).
"""

from __future__ import annotations

import timm.optim.muon as timm_muon
import torch


def ns_dtype(device: torch.device) -> torch.dtype:
    """The iteration's dtype: bfloat16 on a GPU, float32 on a CPU. The rule reads the device's type alone, so
    every process of a run chooses alike (its updates must agree)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def uses_muon(p: torch.Tensor, group: dict) -> bool:
    """timm's routing: the group's flag (``use_fallback``, or ``use_muon``), else timm's shape rule."""
    if group.get("use_fallback", False):
        return False
    if "use_muon" in group:
        return group["use_muon"]
    return timm_muon._is_suitable_for_muon(p)


class Muon(timm_muon.Muon):
    """timm's Muon, batched (the module's docstring), its Newton–Schulz iteration in ``ns_dtype``."""

    def __init__(self, params, ns_dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        routed = [self.route(group) for group in self.param_groups]
        if not all(batchable(group, muon, adamw) for group, (muon, adamw) in zip(self.param_groups, routed)):
            if self.ns_dtype != torch.bfloat16:
                raise ValueError("vit.training.optim.Muon batches algo 'muon' on plain 2-D matrices with a float lr, not "
                                 "capturable; for anything else it runs timm's step, whose Newton–Schulz iteration "
                                 "is bfloat16: pass ns_dtype=torch.bfloat16")
            super().step()
            return loss
        for group, (muon, adamw) in zip(self.param_groups, routed):
            if muon:
                self.muon_update(group, muon)
            if adamw:
                self.adamw_update(group, adamw)
        return loss

    def route(self, group: dict) -> tuple[list, list]:
        """The group's parameters with a gradient: (Muon's, AdamW's), the choice cached in the state as timm's."""
        muon, adamw = [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Muon does not support sparse gradients")
            state = self.state[p]
            if "use_muon" not in state:
                state["use_muon"] = uses_muon(p, group)
            (muon if state["use_muon"] else adamw).append(p)
        return muon, adamw

    def muon_update(self, group: dict, params: list) -> None:
        """timm's _single_tensor_muon: decay, momentum (Nesterov's if asked), Newton–Schulz, scaled update."""
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        lr, momentum = group["lr"], group["momentum"]
        grads = [p.grad for p in params]
        buffers = [self.state[p]["momentum_buffer"] for p in params]
        if group["weight_decay"]:
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        torch._foreach_lerp_(buffers, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, buffers, momentum) if group["nesterov"] else buffers
        coefficients = timm_muon.resolve_ns_coefficients(group["ns_coefficients"], timm_muon._COEFFICIENTS)
        # one batch per shape up to transposition: timm orthogonalises a tall matrix as its transpose, so an
        # (m, n) and an (n, m) matrix with the same lr scale share a batch (the MLP's two), wide ones first
        batches = {}
        for i, p in enumerate(params):
            scale = timm_muon.get_lr_scale(p.shape, group["adjust_lr_fn"]) if group["adjust_lr_fn"] else 1.0
            batches.setdefault((tuple(sorted(p.shape)), scale, p.dtype, p.device), [[], []])[
                p.shape[0] > p.shape[1]].append(i)
        for (_, scale, dtype, _), (wide, tall) in batches.items():
            ortho = timm_muon.zeropower_via_newtonschulz(
                torch.stack([updates[i] for i in wide] + [updates[i].mT for i in tall]), group["ns_steps"],
                coefficients, eps=group["eps"], safety_factor=group["safety_factor"], dtype=self.ns_dtype,
                scale_eps=group["scale_eps"])
            # contiguous, in the parameters' dtype (the foreach kernels' fast path); the tall ones transposed back
            parts = [ortho[: len(wide)].to(dtype, memory_format=torch.contiguous_format),
                     ortho[len(wide) :].mT.to(dtype, memory_format=torch.contiguous_format)]
            torch._foreach_add_([params[i] for i in wide + tall], [m for part in parts for m in part.unbind()],
                                alpha=-lr * scale)

    def adamw_update(self, group: dict, params: list) -> None:
        """timm's _single_tensor_adamw, or _single_tensor_nadamw when the group is Nesterov's, as timm's Muon
        calls them: lr × fallback_lr_scale, the group's eps."""
        for p in params:
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.tensor(0.0)  # timm's: a float scalar on the CPU
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        lr = group["lr"] * group["fallback_lr_scale"]
        grads = [p.grad for p in params]
        steps = [self.state[p]["step"] for p in params]
        exp_avgs = [self.state[p]["exp_avg"] for p in params]
        exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
        torch._foreach_add_(steps, 1)
        counts = torch.stack(steps).tolist()  # one read for the group
        if group["weight_decay"]:
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        if group["nesterov"]:
            exp_avgs = torch._foreach_lerp(exp_avgs, grads, 1 - beta1)
        denominators = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denominators, [(1 - beta2 ** n) ** 0.5 for n in counts])
        torch._foreach_add_(denominators, group["eps"])
        torch._foreach_addcdiv_(params, exp_avgs, denominators, [-lr / (1 - beta1 ** n) for n in counts])


def batchable(group: dict, muon: list, adamw: list) -> bool:
    """Whether Muon.step batches the group (else timm's step runs)."""
    plain = all(type(p.data) is torch.Tensor and not p.is_complex() for p in muon + adamw)
    return (group["algo"] == "muon" and not group["capturable"] and not torch.is_tensor(group["lr"]) and plain
            and all(p.ndim == 2 for p in muon))


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all ``grads`` together, as ``torch.nn.utils.get_total_norm`` computes it, in three ops
    (one foreach norm, a stack, a norm) where torch's issues one more per tensor; nothing is read on the host."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
