"""Speed figures, measured in one run on whatever device is present (``vit-benchmark``, ``scripts/benchmark.py``).

One module per section: ``model`` (our ViT against timm's of the same shape, with ``patch_embedding``),
``data``, ``step`` (the whole training step, beside the machine's matmul ``peak``), ``fast_paths`` (the
cpu recipe's model in fp32, bf16 autocast, compiled, and Muon's Newton–Schulz in float32 and bfloat16),
``classify``, ``checkpoint``, ``startup``, ``folders`` (an image-folder run's start, first and
requeued) and ``breakdown`` (where a training step of the default recipe's model goes, eager and compiled);
each has ``section(report, args, device, dtype)``, which
measures into the report and prints its table. ``runner`` runs the sections asked in order,
``time_bound`` cuts a section short at ``--minutes`` and ``report`` writes the report and the tables.
"""
