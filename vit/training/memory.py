"""The accelerator's memory running out (torch.OutOfMemoryError): not a bug. One line gives the batch each
device took and the flags that take fewer images per device at a time (exit 7, vit.exits)."""

from __future__ import annotations


def out_of_memory_message(error: BaseException, datamodule) -> str:
    """One line: the batch each device took, and flags that take fewer images per device at a time and keep
    the images (and so the lr) of each optimizer step (vit.data.datamodules.split_batch accepts them), then other ways."""
    trainer = getattr(datamodule, "trainer", None)
    total = getattr(datamodule, "batch_size", None)
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    rest = (f"a smaller --data.batch_size (the lr scales with it), --trainer.precision bf16-mixed, or more devices "
            f"(each takes a smaller share) ({first[:200]})")
    if trainer is None or not isinstance(total, int):
        return f"the accelerator ran out of memory with this batch. Try half the batch with twice " \
               f"--trainer.accumulate_grad_batches, {rest}"
    share, (flags, passes) = datamodule.process_batch(), smaller_passes(trainer, total)
    line = f"the accelerator ran out of memory with {share} images per device (the global batch {total} split " \
           f"among the processes)."
    if flags:
        return f"{line} Try {flags} (the same {total * trainer.accumulate_grad_batches} images and lr per optimizer " \
               f"step, {passes} per device at a time), {rest}"
    return f"{line} Each device already takes the fewest images the split allows; try {rest}"


def smaller_passes(trainer, total: int) -> tuple[str | None, int]:
    """The flags that divide ``total`` (the global batch) by the smallest factor the split among the Trainer's
    processes accepts, and multiply the accumulation by it, and the images per device they give; (None, 0)
    when no smaller share splits (vit.data.datamodules.MIN_SHARE per process, even under Mixup/CutMix)."""
    from vit.data.datamodules import split_batch
    from vit.exits import ConfigError

    world, k = trainer.world_size, trainer.accumulate_grad_batches
    pairs = getattr(trainer.lightning_module, "mixes_pairs", False)
    for factor in range(2, total + 1):
        if total % factor:
            continue
        try:
            share = split_batch(total // factor, world, pairs)
        except ConfigError:
            continue
        return f"--data.batch_size {total // factor} --trainer.accumulate_grad_batches {k * factor}", share
    return None, 0
