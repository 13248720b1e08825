"""timm's Muon with a batched step, and its Newton–Schulz iteration in a dtype of our choice (``ns_dtype``).

The optimizer is timm's Muon: its parameter routing (Muon for the matrices, AdamW for the groups flagged
``use_fallback`` and for what timm finds unsuited), its lr scaling and its state, key for key, so that a
checkpoint of either one resumes in the other. Its step does the same arithmetic in fewer, larger ops:

- each element-wise update (weight decay, momentum, Adam's moments) is one ``torch._foreach_*`` op over the
  parameter group, instead of one op per tensor;
- the matrices of one shape (up to transposition: timm orthogonalises a tall matrix as its transpose) are
  stacked into one batch and orthogonalised by one call of timm's ``zeropower_via_newtonschulz`` (5 iterations
  of 3 batched matrix products), instead of one call per matrix;
- the AdamW fallback's bias corrections are tensor maths on the step counts, where timm reads each
  parameter's count on the host with ``.item()``; the counts are kept on the parameters' device (timm keeps
  them on the CPU: a checkpoint of either resumes in the other, the counts moved where the step keeps them).

The step also takes the gradients' total norm (``grad_norm``, kept on the device for whoever watches it:
vit.training.guards.StopOnNonFinite) and clips them to ``max_norm`` when it is set, as torch's
``clip_grad_norm_`` does: one norm a step, for clipping and the guard alike (vit.training.module).

``compiled=True`` runs all of it in torch.compile graphs (fullgraph, static shapes): the norm and clipping
one, each group's update one (Muon's, and AdamW's of each group), compiled once for the run; on a GPU, a few
fused kernels launched by each graph instead of about a hundred ops each launched by the host. The learning
rates reach the graphs as tensors on the parameters' device, filled in place each step (timm's schedulers write
a float into each group), so a new lr is a new value, not a new graph; each holds one element, not none (a 0-d
tensor on the CPU would be read on the host at every call).

On a GPU an op is one kernel launch or a few: for the default model (36 matrices in 3 batches, 80 other
tensors) the eager step orthogonalises with 45 batched products where timm's runs 540, its AdamW takes a few
foreach ops where timm's runs several per tensor (torch's profiler counts them: docs/speed.md), and none of its
ops waits on the GPU. The numbers are those of timm's step (tests/test_optim.py compares them in float32 on a
CPU, eager and compiled).

Where a group is one this step does not batch — algo "adamuon", capturable, a tensor lr, a Muon parameter
that is not a plain 2-D matrix (a convolution, a DTensor), a complex parameter — the step is timm's own
(eager, after the same norm and clipping), whose Newton–Schulz iteration is bfloat16: with another
``ns_dtype`` the step raises ValueError. timm's ``verbose`` routing log is not printed.

``ns_dtype``: bfloat16 on a GPU, its fast path; float32 on a CPU, where bfloat16 matrix products are emulated
on most chips (an AMD EPYC Milan, most laptops) and cost the cpu recipe a large share of its steps (the
benchmark's fast-paths section measures it: docs/results.md).
"""

from __future__ import annotations

import timm.optim.muon as timm_muon
import torch

from vit.training.graphs import graph


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
    """timm's Muon, batched (the module's docstring), its Newton–Schulz iteration in ``ns_dtype``; ``compiled``:
    the step in torch.compile graphs. ``max_norm`` (None: no clipping) may be set between steps;
    ``grad_norm`` is the last step's total gradient norm before clipping (None before the first step)."""

    def __init__(self, params, ns_dtype: torch.dtype = torch.bfloat16, compiled: bool = False,
                 max_norm: float | None = None, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype, self.compiled, self.max_norm = ns_dtype, compiled, max_norm
        self.grad_norm: torch.Tensor | None = None
        self._clip, self._muon, self._adamw = (graph(f, compiled) for f in (clip, muon_update, adamw_update))
        self._lrs: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        routed = [self.route(group) for group in self.param_groups]
        params = [p for muon, adamw in routed for p in muon + adamw]
        if not all(batchable(group, muon, adamw) for group, (muon, adamw) in zip(self.param_groups, routed)):
            if self.ns_dtype != torch.bfloat16:
                raise ValueError("vit.training.optim.Muon batches algo 'muon' on plain 2-D matrices with a float lr, not "
                                 "capturable; for anything else it runs timm's step, whose Newton–Schulz iteration "
                                 "is bfloat16: pass ns_dtype=torch.bfloat16")
            self.grad_norm = clip([p.grad for p in params], self.max_norm) if params else None
            super().step()
            return loss
        if not params:
            return loss
        self.grad_norm = self._clip([p.grad for p in params], self.max_norm)
        for group, (muon, adamw), lr in zip(self.param_groups, routed, self.lrs()):
            self.init_state(muon, adamw)
            options = {k: v for k, v in group.items() if k not in ("params", "lr")}  # (the lr: a value, not a constant)
            if muon:
                self._muon(muon, [self.state[p]["momentum_buffer"] for p in muon], lr, options, self.ns_dtype)
            if adamw:
                self._adamw(adamw, *([self.state[p][key] for p in adamw] for key in ("step", "exp_avg", "exp_avg_sq")),
                            lr, options)
        return loss

    def lrs(self) -> list:
        """Each group's lr: the float itself (eager), or a 1-element tensor on its parameters' device holding it
        (compiled: a value the graph reads, not a constant it is compiled for)."""
        if not self.compiled:
            return [group["lr"] for group in self.param_groups]
        for group in self.param_groups[len(self._lrs) :]:
            device = group["params"][0].device if group["params"] else None
            self._lrs.append(torch.zeros(1, dtype=torch.float64, device=device))
        for lr, group in zip(self._lrs, self.param_groups):
            lr.fill_(group["lr"])
        return self._lrs[: len(self.param_groups)]

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

    def init_state(self, muon: list, adamw: list) -> None:
        """The state of a group's parameters, created as timm's: momentum for Muon's, step count and moments for
        AdamW's (the count on the parameter's device)."""
        for p in muon:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        for p in adamw:
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif state["step"].device != p.device:  # (a checkpoint of timm's step, which counts on the CPU)
                state["step"] = state["step"].to(p.device)


def clip(grads: list[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """The gradients' total norm; with ``max_norm``, the gradients scaled to it as torch's clip_grad_norm_
    scales them (by max_norm / (norm + 1e-6), at most 1)."""
    norm = total_norm(grads)
    if max_norm:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def muon_update(params: list, buffers: list, lr, options: dict, ns_dtype: torch.dtype) -> None:
    """timm's _single_tensor_muon: decay, momentum (Nesterov's if asked), Newton–Schulz, scaled update."""
    lr = lr.reshape(()) if torch.is_tensor(lr) else lr  # (Muon.lrs)
    momentum = options["momentum"]
    grads = [p.grad for p in params]
    if options["weight_decay"]:
        torch._foreach_mul_(params, 1 - lr * options["weight_decay"])
    torch._foreach_lerp_(buffers, grads, 1 - momentum)
    updates = torch._foreach_lerp(grads, buffers, momentum) if options["nesterov"] else buffers
    coefficients = timm_muon.resolve_ns_coefficients(options["ns_coefficients"], timm_muon._COEFFICIENTS)
    # one batch per shape up to transposition: timm orthogonalises a tall matrix as its transpose, so an
    # (m, n) and an (n, m) matrix with the same lr scale share a batch (the MLP's two), wide ones first
    batches = {}
    for i, p in enumerate(params):
        scale = timm_muon.get_lr_scale(p.shape, options["adjust_lr_fn"]) if options["adjust_lr_fn"] else 1.0
        batches.setdefault((tuple(sorted(p.shape)), scale, p.dtype, p.device), [[], []])[
            int(p.shape[0] > p.shape[1])].append(i)
    for (_, scale, dtype, _), (wide, tall) in batches.items():
        ortho = timm_muon.zeropower_via_newtonschulz(
            torch.stack([updates[i] for i in wide] + [updates[i].mT for i in tall]), options["ns_steps"],
            coefficients, eps=options["eps"], safety_factor=options["safety_factor"], dtype=ns_dtype,
            scale_eps=options["scale_eps"])
        # contiguous, in the parameters' dtype (the foreach kernels' fast path); the tall ones transposed back
        parts = [ortho[: len(wide)].to(dtype, memory_format=torch.contiguous_format),
                 ortho[len(wide) :].mT.to(dtype, memory_format=torch.contiguous_format)]
        steps = torch._foreach_mul([m for part in parts for m in part.unbind()], -lr * scale)
        torch._foreach_add_([params[i] for i in wide + tall], steps)


def adamw_update(params: list, steps: list, exp_avgs: list, exp_avg_sqs: list, lr, options: dict) -> None:
    """timm's _single_tensor_adamw, or _single_tensor_nadamw when the group is Nesterov's, as timm's Muon
    calls them: lr × fallback_lr_scale, the group's eps; the bias corrections from the step counts as tensors."""
    beta1, beta2 = options["betas"]
    lr = (lr.reshape(()) if torch.is_tensor(lr) else lr) * options["fallback_lr_scale"]  # (Muon.lrs)
    grads = [p.grad for p in params]
    torch._foreach_add_(steps, 1)
    counts = torch.stack(steps)
    step_sizes = (-lr / (1 - beta1 ** counts)).unbind()
    corrections = (1 - beta2 ** counts).sqrt().unbind()
    if options["weight_decay"]:
        torch._foreach_mul_(params, 1 - lr * options["weight_decay"])
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    if options["nesterov"]:
        exp_avgs = torch._foreach_lerp(exp_avgs, grads, 1 - beta1)
    denominators = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denominators, corrections)
    torch._foreach_add_(denominators, options["eps"])
    updates = torch._foreach_div(exp_avgs, denominators)
    torch._foreach_mul_(updates, step_sizes)
    torch._foreach_add_(params, updates)


def batchable(group: dict, muon: list, adamw: list) -> bool:
    """Whether Muon.step batches the group (else timm's step runs)."""
    plain = all(type(p.data) is torch.Tensor and not p.is_complex() for p in muon + adamw)
    return (group["algo"] == "muon" and not group["capturable"] and not torch.is_tensor(group["lr"]) and plain
            and all(p.ndim == 2 for p in muon))


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all ``grads`` together, as ``torch.nn.utils.get_total_norm`` computes it, in three ops
    (one foreach norm, a stack, a norm) where torch's issues one more per tensor; nothing is read on the host."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
