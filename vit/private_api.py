"""Every private name of another library this package uses, each with why no public API does the job.
pyproject bounds those libraries to the major versions the tests ran with (lightning < 3, wandb < 1,
timm < 2); tests/test_private_api.py finds every private attribute the package reads from a library
and fails on one that is not listed here, or on an entry whose use is gone."""

PRIVATE_USES = (
    # (file, what, why)
    ("vit/training/agreement.py", "fit_loop.epoch_loop._broadcast_sigterm_tensor", "under DDP Lightning's training loop broadcasts rank "
     "zero's SIGTERM state before every batch and reads it on the host (a collective and a GPU sync every step), "
     "with no option to turn it off: the agreement replaces it on the loop, so that a step issues no collective "
     "but the gradients' all-reduce"),
    ("vit/training/module.py", "_step_supports_amp_scaling", "an optimizer that unscales its gradients inside its own "
     "step under a gradient scaler (torch's fused AdamW with 16-mixed) still holds scaled gradients when clipping "
     "runs, so its clipping is left to Lightning; torch marks such an optimizer with this attribute alone (its "
     "GradScaler reads the same one), with no public flag"),
    ("vit/training/progress.py", "TQDMProgressBar.refresh_rate", "the bar moves every log_every_n_steps batches, which "
     "is known only at setup; TQDMProgressBar takes its rate in its constructor and reads it through this property "
     "alone, which ProgressBar overrides"),
    ("vit/training/progress.py", "_logger_connector", "ProgressBar shows trainer._logger_connector._progress_bar_metrics, "
     "the values every rank has already computed: the public trainer.progress_bar_metrics computes them, a synced "
     "metric's all-gather that rank zero alone would issue (a DDP deadlock)"),
    ("vit/training/loggers.py", "_wandb_init", "WandbLogger drops the 'anonymous' entry Lightning always passes to "
     "wandb.init, of which wandb warns that it has no effect (no constructor argument leaves it out), and turns "
     "its mode to offline when rank zero finds the W&B server out of reach, which is known only when the run "
     "starts, after the constructor"),
    ("vit/training/loggers.py", "_experiment", "WandbLogger asks the network only before its W&B run exists "
     "(Lightning's experiment property keeps it there, with no public 'started' flag); CSVLogger makes its "
     "appending writer there, as Lightning's own property does"),
    ("vit/training/loggers.py", "_fs", "CSVLogger appends to a resumed run's metrics.csv: Lightning's ExperimentWriter "
     "deletes an existing file (its _check_log_dir_exists, overridden) and has no option to keep it"),
    ("vit/data/resume.py", "fit_loop.epoch_loop.batch_progress", "exact mid-epoch resume needs the batches the training "
     "loop has finished in the current epoch (its batch_progress counters); Lightning keeps them in its loops, "
     "which it documents as internals, with no public accessor; a resume in another split of the global batch "
     "turns the same counters in the checkpoint's loops entry into its own batches (DataSplit), which no "
     "public hook of Lightning's does"),
    ("vit/training/schedule.py", "fit_loop.setup_data", "the schedule (built in configure_optimizers) needs num_training_batches of an open-ended run "
     "(a time budget) to lay warmup in epochs; Lightning computes it in the fit loop's setup_data, which it "
     "calls only after configure_optimizers in that case"),
    ("vit/data/datamodules.py", "DataLoader._iterator", "SkipUnreadable (a wrapper of the image folders' DataLoader) forwards "
     "the loader's _iterator, which Lightning (CombinedLoader.reset, its _shutdown_workers_and_reset_iterator) "
     "reads and clears to shut the persistent workers down when a stage ends; torch has no public call that ends "
     "a DataLoader's workers"),
    ("vit/training/progress.py", "ModelSummary.summarize", "the model summary adds the notes' FLOPs per image under "
     "Lightning's table: ModelSummary.summarize is the callback's own (undocumented) printing step"),
    ("vit/data/cifar.py", "numpy._core.multiarray", "the restricted unpickler of CIFAR-10's files allows numpy's array "
     "constructor under the module name numpy 2 pickles it with (numpy.core in numpy 1)"),
    ("vit/data/datamodules.py", "lightning.pytorch.overrides.distributed", "UnrepeatedDistributedSampler: under DDP each "
     "validation and test image counts once (no padding); Lightning's own sampler, in a module it does not document"),
    ("vit/data/cifar.py", "_Pickler", "write_fake pickles bytes as Python 2's str, as the official CIFAR-10 files are "
     "(so that our reader and torchvision's both read them); only the pure-Python pickler lets a type's "
     "opcode be chosen (its dispatch table), the C pickler has no such hook"),
    ("vit/training/optim.py", "_foreach_", "Muon's step applies each element-wise update to a whole parameter group in "
     "one op (one kernel launch on a GPU): torch's foreach ops (torch._foreach_mul_, _foreach_lerp_, _foreach_lerp, "
     "_foreach_add_, _foreach_addcmul_, _foreach_sqrt, _foreach_div_, _foreach_addcdiv_), the ops torch.optim's "
     "own foreach paths call; torch 2.x has no public name for them (the public torch.foreach of torch's main-branch "
     "documentation is not in torch 2.14)"),
    ("vit/training/optim.py", "Muon.step", "the override of timm's Muon.step keeps timm's parameter routing and its state "
     "layout (use_muon; momentum_buffer; step, exp_avg, exp_avg_sq), which timm does not document: "
     "tests/test_optim.py holds our step equal to timm's and their checkpoints interchangeable"),
    ("vit/training/optim.py", "_is_suitable_for_muon", "Muon's step routes a parameter of a group without a flag as timm's "
     "step does, by timm's shape rule, which is this function of timm's module"),
    ("vit/training/optim.py", "_COEFFICIENTS", "Muon's step resolves a group's ns_coefficients preset ('quintic', timm's "
     "default) with timm's public resolve_ns_coefficients, which takes the presets as an argument: timm's step "
     "passes this dict of its module, the only place the presets are named"),
    ("vit/training/guards.py", "torch._dynamo.callback_handler", "the watchdog gives torch.compile's compiles their time "
     "wherever they happen (a first batch, a resize stage, a callback's forward, the lazily compiled backward): "
     "torch calls these start and end callbacks around each compile, and no public torch.compiler API tells "
     "another thread that this one compiles (torch.compiler.is_compiling answers only inside the traced code)"),
    ("vit/training/loggers.py", "wandb.sdk.lib.wbauth.read_netrc_auth", "whether wandb will find a key in the netrc file for "
     "the server it logs to (a self-hosted one's host:port, or the host behind W&B's default URL): wandb's own "
     "reader, as wandb.init uses it, where wandb has one (older versions read the file with requests' public "
     "get_netrc_auth); wandb has no public function that answers without logging in or prompting"),
    ("tests/test_sweeps.py", "wandb_agent.Agent._command_run", "the sweeps test builds each run's command line with "
     "W&B's sweep agent's own code, the thing under test: Agent._command_run expands the sweep's command macros "
     "(${env}, ${interpreter}, ${program}, ${args}, ${args_json}, ${args_json_file}) inline, and no public function "
     "returns that command (create_sweep_command_args gives the macros' values, not the agent's expansion); the "
     "test sets _sweep_command as the agent's setup does from the sweep's config, and records AgentProcess's "
     "command instead of starting it; a test only, not the package"),
    ("vit/benchmark/data.py", "_check_integrity", "the benchmark's torchvision CIFAR10 reads generated files whose md5s "
     "are not the official ones (with _load_meta, overridden); benchmark only"),
)
