"""Where a run runs: launchers, GPUs, the network, the disk, run folders and their lock, checkpoint writes."""
