"""Lightning's W&B logger, made never to block on a login prompt or an unreachable server (it logs offline
instead), and its CSV logger, made to keep a resumed run's metrics."""

from __future__ import annotations

import csv
import logging
import os
import sys
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_info

from vit.exits import ConfigError
from vit.cluster.network import unreachable


class NoNoise(logging.Filter):
    """Drop Lightning log lines a user cannot act on (its litlogger tip, its note on counting steps, ...)."""

    NOISE = ("💡 Tip", "Loading `train_dataloader` to estimate number of stepping batches",
             "Trainer already configured with model summary callbacks")  # (we add our own)

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOISE)


def quiet_lightning() -> None:
    """Filter Lightning's rank-zero log with NoNoise; called by the training command, not at import."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, NoNoise) for f in logger.filters):
        logger.addFilter(NoNoise())


def wandb_base_url() -> str:
    """The W&B server wandb logs to, found as wandb finds it: WANDB_BASE_URL, else the host that
    `wandb login --host URL` saved, else wandb's default."""
    url = os.environ.get("WANDB_BASE_URL")
    if not url:
        import wandb

        settings = wandb.Settings(silent=True)
        settings.settings_system = str(Path(os.environ.get("WANDB_CONFIG_DIR") or "~/.config/wandb").expanduser()
                                       / "settings")
        settings.update_from_system_settings()
        url = settings.base_url
    return url.rstrip("/")


def wandb_unreachable(timeout: float) -> str | None:
    """Why the W&B server cannot be reached, or None if it answers a GraphQL query within ``timeout`` seconds.
    Only a W&B answer counts (GraphQL, 2xx, or 401 for no credentials), not a proxy's 407, 403 or 5xx."""
    import json

    url = wandb_base_url()

    def from_wandb(status: int, body: bytes) -> bool:
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        return isinstance(answer, dict) and ("data" in answer or "errors" in answer) or \
            200 <= status < 300 or status == 401

    why = unreachable(f"{url}/graphql", timeout, data=b'{"query": "{ __typename }"}', accept=from_wandb)
    return why and f"{url} {why}"


def wandb_credentials_present() -> bool:
    """Whether wandb will find credentials for ``wandb_base_url()``: WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE,
    or that server's netrc entry (where `wandb login` writes it)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    from wandb.errors import AuthenticationError
    from wandb.sdk.lib.wbauth import read_netrc_auth  # (private: vit.private_api)

    try:
        return bool(read_netrc_auth(host=wandb_base_url()))
    except (AuthenticationError, ValueError):  # a malformed key or URL: wandb could not log in with it either
        return False


class WandbLogger(_LightningWandbLogger):
    """Lightning's WandbLogger that never waits for a login or an unreachable server: without credentials, or
    with no answer within ``reach_timeout`` seconds (instead of wandb's 90 s and a traceback), it logs offline,
    to be uploaded later with `vit-sync`. Only rank zero asks the network, once."""

    def __init__(self, *args, project: str | None = None, reach_timeout: float = 10.0, **kwargs):
        """
        Args:
            project: the W&B project; default: WANDB_PROJECT, else "vit" (the team: WANDB_ENTITY or W&B's default).
            reach_timeout: seconds to wait for the W&B server's answer before logging offline.
        """
        kwargs["project"] = project or os.environ.get("WANDB_PROJECT") or "vit"
        # every start of a run appends to its one W&B run: resume "allow" (the CLI passes None, under which a
        # later start would replace the history); anything else is refused before any work
        if kwargs.get("resume") is None:
            kwargs.pop("resume", None)
        elif kwargs["resume"] != "allow":
            raise ConfigError(f"--trainer.logger.init_args.resume {kwargs['resume']}: every start of a run (a resume, "
                              f"a requeued job) logs to the run's own W&B run, going on after what it logged: leave "
                              f"it unset (\"allow\")")
        for option in ("fork_from", "resume_from"):
            if kwargs.get(option) is not None:
                raise ConfigError(f"--trainer.logger.init_args.{option}: every start of a run (a resume, a requeued "
                                  f"job) logs to the run's own W&B run, going on after what it logged, which "
                                  f"{option} would rewind or fork at each start: leave it unset")
        self.reach_timeout = reach_timeout
        mode = os.environ.get("WANDB_MODE")
        if not kwargs.get("offline") and mode is None and not wandb_credentials_present():
            # wandb's offline mode, not Lightning's offline=True (which refuses log_model)
            kwargs["mode"] = "offline"
            rank_zero_info(f"wandb: no credentials found for {wandb_base_url()} (WANDB_API_KEY, or `wandb login` "
                           "in a netrc file), logging offline; "
                           f"upload later with `vit-sync {kwargs.get('save_dir', '.')}` on a machine with network")
        super().__init__(*args, **kwargs)
        self._wandb_init.pop("anonymous", None)  # wandb warns that the setting has no effect
        from vit.cluster.runs import sweep_run_id

        if sweep_run_id():  # a sweep's run: W&B takes id, project and team from the sweep (and warns if given)
            for key in ("id", "project", "entity"):
                self._wandb_init.pop(key, None)
        # wandb's service may be a parent's (WANDB_SERVICE), started in another folder: pass an absolute dir
        self._wandb_init["dir"] = os.path.abspath(self._wandb_init.get("dir") or ".")

    @property
    @rank_zero_experiment
    def experiment(self):
        offline = ("offline", "disabled", "dryrun")
        if self._experiment is None and self._wandb_init.get("mode") not in offline \
                and os.environ.get("WANDB_MODE") not in offline:
            reason = wandb_unreachable(self.reach_timeout)
            if reason is not None:
                self._wandb_init["mode"] = "offline"
                rank_zero_info(f"wandb: {reason}; logging offline into {self.save_dir}/wandb; upload later with "
                               f"`vit-sync {self.save_dir}` on a machine with network")
        return _LightningWandbLogger.experiment.fget(self)


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        """Keep an existing metrics.csv (a resumed run) and its columns, instead of deleting it."""
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = next(csv.reader(f), [])


class CSVLogger(_LightningCSVLogger):
    """Lightning's CSVLogger writing ``metrics.csv`` into the run folder, appending on resume (Lightning's
    deletes the file)."""

    def __init__(self, save_dir: str = "."):
        super().__init__(save_dir, name="", version="")

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def wandb_logger(loggers) -> _LightningWandbLogger | None:
    """The W&B logger (ours or Lightning's) among ``loggers``, or None."""
    return next((lg for lg in loggers if isinstance(lg, _LightningWandbLogger)), None)


def end_wandb_run(code: int) -> None:
    """End the W&B run here, not in wandb's exit hook, which writes terminal colour codes into log files."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=code)
