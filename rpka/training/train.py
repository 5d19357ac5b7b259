"""One training run: ``train_run(run_config) -> result``, a pure function.

The scale-out seam of docs/design.md section 9.

A run trains the S seeds of one configuration (arm, learning rate) as one stacked model
and scores it on a split. The loop is the same for every track; the model, the loss and
the metrics come from the track's :class:`rpka.tracks.base.Task` (``forecast``: ``TransformerTiny``,
mean squared error, MSE/MAE; ``lm``: the causal ``TransformerLM``, cross-entropy,
perplexity/NLL). Everything it needs is in ``run_config``
(JSON-able; see :func:`make_run_config`); everything it finds is in the returned dict. No
global random state is read or written: member s draws its initialisation and its data
order from ``seeds[s]`` alone, and RPKA's pivots from a generator seeded by the run.

Divergence (docs/design.md section 5): a member whose training loss (or validation error)
becomes non-finite is recorded as ``diverged`` with the epoch and step, reset to its
initial parameters and frozen there (its gradients are masked with ``torch.where``, since
``nan * 0`` is ``nan``), so it can no longer disturb anything; the other members go on.
A run never raises because a member diverged.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm  # plain text bars: no ipywidgets needed in notebooks

from rpka.attention import options_of
from rpka.config.bench import ArmConfig, TrainConfig
from rpka.io import STATE_CHECKSUM_KEY, atomic_torch_save, file_sha256
from rpka.model import ModelConfig
from rpka.numerics import record as numerics_record
from rpka.tracks import Task, get_task
from rpka.training.curriculum import WARM_START_KEY, first_stage_config, load_stretched
from rpka.training.run_config import (
    STREAM_DATA,
    STREAM_INIT,
    STREAM_PIVOTS,
    check_run_config,
    derive_seed,
    hashed_config,
    run_id,
)
from rpka.training.seed_data import (
    data_per_seed,
    data_seeds_of,
    member_batch,
    n_windows,
    run_splits,
)
from rpka.training.tally import Clock, Tally

PHASE_OF = {"val": "sweep", "test": "eval"}  # the bench's phase that scores each split


def track_config_of(run_config: dict[str, Any]) -> Any:
    """The track's configuration (its task's ``config_class``) of a run, by its name."""
    track = dict(run_config["track"])
    return get_task(track.get("name")).config_class(**track)


def build_model(run_config: dict[str, Any], track_config: Any, device: torch.device) -> nn.Module:
    """The stacked model of a run (the track's); RPKA-like methods get a generator seeded
    by the run."""
    arm = ArmConfig(**run_config["arm"])
    options = dict(arm.options)
    if "generator" in options_of(arm.method):
        seed = derive_seed(*run_config["seeds"], STREAM_PIVOTS)
        options["generator"] = torch.Generator(device=device).manual_seed(seed)
    init_seeds = [derive_seed(s, STREAM_INIT) for s in run_config["seeds"]]
    task = get_task(track_config.name)
    model = task.build_model(
        ModelConfig(**run_config["model"]), track_config, init_seeds, arm.method, options
    )
    return model.to(device)


def lr_factor(schedule: str, step: int, total_steps: int) -> float:
    """Learning-rate multiplier at ``step``: 1, or a half cosine from 1 to 0."""
    if schedule == "constant":
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * min(step, total_steps) / max(total_steps, 1)))


def member_batches(n_windows: int, batch_size: int, generators: list[torch.Generator]) -> Tensor:
    """One epoch of window indices (steps, S, B): member s shuffles with its own generator.

    The last incomplete batch is dropped so every step has S x B windows.
    """
    steps = n_windows // batch_size
    orders = [torch.randperm(n_windows, generator=g)[: steps * batch_size] for g in generators]
    return torch.stack(orders).view(len(generators), steps, batch_size).transpose(0, 1)


@torch.no_grad()
def evaluate(
    model: nn.Module, task: Task, x: Tensor, y: Tensor, batch_size: int, per_member: bool = False
) -> dict[str, Tensor]:
    """Per-member metrics (S,) of the task over a whole split: inputs x (N, ...), targets
    y (N, ...) shared by the members, or with ``per_member`` each member's own (S, N, ...)
    (``rpka.training.seed_data``) (forecast: MSE, MAE; lm: perplexity, NLL)."""
    model.eval()
    n_members = model.n_members
    device = model.position.device
    sums: dict[str, Tensor] = {}
    for start in range(0, n_windows(x, per_member), batch_size):
        part = slice(start, start + batch_size)
        xb = (x[:, part] if per_member else x[part]).to(device)
        yb = (y[:, part] if per_member else y[part]).to(device)
        inputs = xb if per_member else xb.expand(n_members, *xb.shape)
        for key, value in task.error_sums(model(inputs), yb).items():
            sums[key] = sums[key] + value if key in sums else value
    model.train()
    return task.finish(sums, task.count(y[0] if per_member else y))


def clip_per_member(params: list[Tensor], max_norm: float) -> Tensor:
    """Scale each member's gradient to norm <= max_norm; returns the norms (S,)."""
    squares = sum(p.grad.pow(2).flatten(1).sum(1) for p in params)
    norms = squares.sqrt()
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad.mul_(scale.view(-1, *([1] * (p.dim() - 1))))
    return norms


def _member_view(mask: Tensor, like: Tensor) -> Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _to_list(values: Tensor, alive: Tensor | None = None) -> list[float | None]:
    keep = [True] * len(values) if alive is None else [bool(a) for a in alive]
    pairs = zip(values.tolist(), keep, strict=True)
    return [v if math.isfinite(v) and ok else None for v, ok in pairs]


@dataclasses.dataclass
class Run:
    """Everything one training run works with, built once by :func:`setup_run`."""

    config: dict[str, Any]
    device: torch.device
    task: Task
    track_config: Any
    train: TrainConfig
    splits: dict[str, tuple[Tensor, Tensor]]
    seeds: list[int]
    model: nn.Module
    params: list[Tensor]
    initial: list[Tensor]  # the parameters at initialisation: where a diverged member rests
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    data_generators: list[torch.Generator]  # one per member: its data order
    steps_per_epoch: int
    train_x: Tensor  # the training split on the run's device
    train_y: Tensor
    per_member: bool = (
        False  # each member its own data, splits (S, N, ...): rpka.training.seed_data
    )

    @property
    def n_train(self) -> int:  # windows of the training split (each member's, per seed)
        return n_windows(self.splits["train"][0], self.per_member)

    def evaluate(self, split: str) -> dict[str, Tensor]:
        """The members' metrics on ``split`` (:func:`evaluate`, each on its own data)."""
        x, y = self.splits[split]
        return evaluate(self.model, self.task, x, y, self.train.eval_batch_size, self.per_member)


def setup_run(run_config: dict[str, Any], start: dict[str, Tensor] | None = None) -> Run:
    """Step 1: the track's data, the stacked model (from the weights ``start`` if given,
    positions stretched: ``rpka.training.curriculum``), Adam and its learning-rate schedule."""
    device = torch.device(run_config["device"])
    track_config = track_config_of(run_config)
    task = get_task(track_config.name)
    train_config = TrainConfig(
        **{**run_config["train"], "betas": tuple(run_config["train"]["betas"])}
    )
    splits = run_splits(run_config, task, track_config)  # shared, or per member (seed_data)
    per_member = data_per_seed(run_config)
    n_train = n_windows(splits["train"][0], per_member)
    seeds = list(run_config["seeds"])

    model = build_model(run_config, track_config, device)
    if start is not None:
        load_stretched(model, start)
    params = list(model.parameters())
    initial = [p.detach().clone() for p in params]
    optimizer = torch.optim.Adam(
        params, lr=run_config["lr"], betas=train_config.betas, eps=train_config.eps,
        weight_decay=train_config.weight_decay,
    )  # fmt: skip
    total_steps = train_config.epochs * (n_train // train_config.batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(train_config.lr_schedule, step, total_steps)
    )
    data_generators = [torch.Generator().manual_seed(derive_seed(s, STREAM_DATA)) for s in seeds]
    steps_per_epoch = n_train // train_config.batch_size
    if steps_per_epoch < 1:
        raise ValueError(
            f"train.batch_size={train_config.batch_size} exceeds the {n_train} training examples"
        )
    return Run(
        run_config, device, task, track_config, train_config, splits, seeds, model, params,
        initial, optimizer, schedule, data_generators, steps_per_epoch,
        *(t.to(device) for t in splits["train"]), per_member,
    )  # fmt: skip


class Members:
    """Which members still train, and where each diverged member stopped."""

    def __init__(self, n_members: int, device: torch.device) -> None:
        self.alive = torch.ones(n_members, dtype=torch.bool, device=device)
        self.diverged_at: list[dict[str, int] | None] = [None] * n_members

    def diverge(self, newly: Tensor, epoch: int, step: int, reason: str) -> None:
        """Record the members ``newly`` (S,) bool as diverged (they stop training)."""
        for s in torch.nonzero(newly).flatten().tolist():
            self.diverged_at[s] = {"epoch": epoch, "step": step, "reason": reason}
        self.alive = self.alive & ~newly


def train_step(run: Run, members: Members, batch: Tensor, epoch: int, step: int) -> Tensor:
    """Step 2, repeated: one Adam step for the members still alive; the loss per member (S,)
    (0 for the others). A member whose loss turns non-finite is frozen at its initial
    parameters (its gradients masked with ``torch.where``: ``nan * 0`` is ``nan``)."""
    x, y = (member_batch(t, batch, run.per_member) for t in (run.train_x, run.train_y))
    loss = run.task.loss(run.model(x), y)  # (S,)
    newly = members.alive & ~torch.isfinite(loss)
    alive = members.alive & ~newly
    # sum, not mean: each member's gradient is that of its own loss
    torch.where(alive, loss, 0.0).sum().backward()
    for p in run.params:
        p.grad = torch.where(_member_view(alive, p), p.grad, 0.0)
    if run.train.grad_clip > 0:
        clip_per_member(run.params, run.train.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.schedule.step()
    if not bool(alive.all()):
        with torch.no_grad():  # frozen at their initial values: finite forever
            for p, p0 in zip(run.params, run.initial, strict=True):
                p.copy_(torch.where(_member_view(alive, p), p, p0))
    members.diverge(newly, epoch, step, "non-finite training loss")
    return torch.where(alive, loss.detach().double(), 0.0)


def final_scores(
    run: Run, members: Members, val: dict[str, Tensor] | None
) -> dict[str, dict[str, list]]:
    """Step 3: the metrics of the trained members on validation (and test for evaluation
    runs); None for a diverged member."""
    metrics, n_members = run.task.metrics, len(run.seeds)
    final = {}
    for name in ("val", "test") if run.config["split"] == "test" else ("val",):
        if not bool(members.alive.any()):  # every member diverged or failed: nothing to score
            final[name] = {k: [None] * n_members for k in metrics}
            continue
        scores = val if name == "val" else run.evaluate("test")
        final[name] = {k: _to_list(scores[k], members.alive) for k in metrics}
    return final


def train_run(run_config: dict[str, Any]) -> dict[str, Any]:
    """Train the seeds of one configuration and score them; see the module docstring.

    ``run_config`` keys: ``arm`` {name, method, options}, ``lr``, ``seeds`` (list),
    ``split`` ("val" for sweep runs, "test" for evaluation runs - which also record val),
    ``track`` / ``model`` / ``train`` (the dataclasses as dicts), ``device``, optionally
    ``warm_start`` {track} (train at that shorter context first: ``rpka.training.curriculum``), and
    the result-neutral ``data_dir`` (track cache), ``progress`` {enable, position, leave}
    and ``state_path`` (if set, the trained weights are saved there; see
    ``rpka.training.trained.load_trained``).

    Returns a JSON-able dict: ``run_id``, the configuration, per-member histories and
    final metrics (``members``), ``scores`` {metric: [per seed]} on the scored split,
    timing (``step_ms_median`` of the run's own steps, ``wall_s`` and ``cpu_s`` of both
    stages), RPKA guard counts (``guard_counts``) and, for a warm-started run,
    ``warm_start`` (:func:`first_stage`'s summary).
    """
    check_run_config(run_config)
    clock = Clock()
    first = first_stage(run_config) if run_config.get(WARM_START_KEY) else None
    run = setup_run(run_config, start=first.state if first else None)
    members = first.members if first else Members(len(run.seeds), run.device)
    tally = Tally()
    history, val = fit(run, members, tally)
    final = final_scores(run, members, val)
    state_sha256 = None  # the weights' checksum, in the result (covered by its own checksum)
    if run_config.get("state_path"):  # a run a later stage reads (rpka.bench.keeps_weights)
        atomic_torch_save(run_config["state_path"], run.model.state_dict())
        state_sha256 = file_sha256(run_config["state_path"])
    result = run_result(run, member_records(run, members, history, final), final, tally, clock)
    # sha256 of the weights file saved at state_path (null: none saved); whoever loads
    # them checks it (load_run_state), so a swapped or edited weights file is refused
    result[STATE_CHECKSUM_KEY] = state_sha256
    if first:
        result[WARM_START_KEY] = first.summary
    return result


def fit(run: Run, members: Members, tally: Tally) -> tuple[dict[str, list], Any]:
    """Step 2 over every epoch, validation after each: the members' histories and the
    last validation metrics (None if none was reached)."""
    history: dict[str, list] = {"train_loss": [], **{f"val_{m}": [] for m in run.task.metrics}}
    bar = progress_bar(run)
    # A numerical failure inside the attention (torch.linalg.LinAlgError, e.g. a landmark
    # Gram matrix that float32 cannot factorise) ends the run like a divergence of every
    # member still training - one step mixes them all - and is recorded with its message.
    val = None
    for epoch in range(run.train.epochs):
        loss_sum, failure = train_epoch(run, members, tally, bar, epoch)
        if failure is None:
            try:
                val = run.evaluate("val")
            except torch.linalg.LinAlgError as err:
                failure = f"LinAlgError: {err}"
        if failure is not None:
            members.diverge(members.alive, epoch, tally.steps, failure)
            break
        record_epoch(run, members, history, loss_sum, val, epoch, tally.steps)
        primary = f"val_{run.task.metrics[0]}"  # the first metric is the primary one
        finite_val = [v for v in history[primary][-1] if v is not None]
        if finite_val:
            bar.set_postfix({primary: f"{statistics.mean(finite_val):.3f}"})
    bar.close()
    return history, val


@dataclasses.dataclass
class FirstStage:
    """A warm-started run's first stage: its trained weights, its members (a member that
    diverged there stays diverged) and a summary for the run's result."""

    state: dict[str, Tensor]
    members: Members
    summary: dict[str, Any]


def first_stage(run_config: dict[str, Any]) -> FirstStage:
    """Train the first stage of a warm-started run
    (``rpka.training.curriculum.first_stage_config``)."""
    clock = Clock()
    run = setup_run(first_stage_config(run_config))
    members, tally = Members(len(run.seeds), run.device), Tally()
    _, val = fit(run, members, tally)
    for where in members.diverged_at:
        if where is not None:
            where["stage"] = WARM_START_KEY
    summary = {
        "context": run.track_config.context,
        "n_steps": tally.steps,
        "val": final_scores(run, members, val)["val"],
        "n_diverged": sum(w is not None for w in members.diverged_at),
        "wall_s": clock.wall_s(),
        "cpu_s": clock.cpu_s(),
    }
    return FirstStage(run.model.state_dict(), members, summary)


def progress_bar(run: Run) -> tqdm:
    """The run's bar over its steps, labelled by arm, learning rate and bench phase."""
    progress = run.config.get("progress") or {}
    # a bar below another (position > 0, the bench's) moves the cursor with ANSI escapes,
    # which show as "[A" where stderr is not a terminal (logs, notebooks): there only the
    # outer bar is drawn
    nested_in_a_log = bool(progress.get("position")) and not sys.stderr.isatty()
    arm, lr, split = run.config["arm"]["name"], run.config["lr"], run.config["split"]
    return tqdm(
        total=run.train.epochs * run.steps_per_epoch,
        # the phase, not the scored split: every run shows its validation metric as it trains
        desc=f"{arm} lr={lr:g} {PHASE_OF[split]}",
        position=progress.get("position"),
        leave=progress.get("leave", True),
        disable=not progress.get("enable", True) or nested_in_a_log,
        dynamic_ncols=True,
    )


def train_epoch(
    run: Run, members: Members, tally: Tally, bar: tqdm, epoch: int
) -> tuple[Tensor, str | None]:
    """Step 2 over one epoch, each member in its own data order: the summed training loss
    per member (S,) and the failure that ended the epoch early (None: it did not)."""
    loss_sum = torch.zeros(len(run.seeds), dtype=torch.float64, device=run.device)
    for batch in member_batches(run.n_train, run.train.batch_size, run.data_generators):
        t0 = _now(run.device)
        try:
            loss_sum += train_step(run, members, batch.to(run.device), epoch, tally.steps)
        except torch.linalg.LinAlgError as err:
            return loss_sum, f"LinAlgError: {err}"
        step_time = (_now(run.device) - t0) * 1e3
        if tally.steps >= run.train.warmup_steps:
            tally.step_ms.append(step_time)
        for module in run.model.attention_modules():
            for key, value in getattr(module, "guard_counts", {}).items():
                tally.guards[key] = tally.guards.get(key, 0) + int(value)
        tally.steps += 1
        bar.update(1)
    return loss_sum, None


def record_epoch(
    run: Run,
    members: Members,
    history: dict[str, list],
    loss_sum: Tensor,
    val: dict[str, Tensor],
    epoch: int,
    step: int,
) -> None:
    """After an epoch: a member with a non-finite validation metric diverged; the epoch's
    mean training loss and validation metrics join each member's history (None for the
    diverged)."""
    metrics = run.task.metrics
    finite = torch.stack([torch.isfinite(val[m]) for m in metrics]).all(0)
    members.diverge(members.alive & ~finite, epoch, step, "non-finite validation error")
    history["train_loss"].append(_to_list(loss_sum / run.steps_per_epoch, members.alive))
    for m in metrics:
        history[f"val_{m}"].append(_to_list(val[m], members.alive))


def member_records(
    run: Run, members: Members, history: dict[str, list], final: dict[str, dict[str, list]]
) -> list[dict[str, Any]]:
    """Per member: its seed, status (``ok`` or ``diverged``, and where), its history and
    its final metrics per scored split."""
    diverged_at = members.diverged_at
    return [
        {
            "seed": seed,
            "status": "ok" if diverged_at[s] is None else "diverged",
            "diverged_at": diverged_at[s],
            **{key: [row[s] for row in rows] for key, rows in history.items()},
            "final": {split: {k: v[s] for k, v in m.items()} for split, m in final.items()},
        }
        for s, seed in enumerate(run.seeds)
    ]


def run_result(
    run: Run,
    records: list[dict[str, Any]],
    final: dict[str, dict[str, list]],
    tally: Tally,
    clock: Clock,
) -> dict[str, Any]:
    """The run's JSON-able result (:func:`train_run`), but for its weights' checksum."""
    run_config = run.config
    return {
        "run_id": run_id(run_config),
        "config": hashed_config(run_config),
        "arm": run_config["arm"]["name"],
        "lr": run_config["lr"],
        "seeds": run.seeds,
        "split": run_config["split"],
        "scores": final[run_config["split"]],
        "members": records,
        "n_diverged": sum(r["diverged_at"] is not None for r in records),
        "n_train_windows": run.n_train,
        "attention_tokens": run.track_config.attention_tokens,
        "steps_per_epoch": run.steps_per_epoch,
        "n_steps": tally.steps,
        "step_ms_median": statistics.median(tally.step_ms) if tally.step_ms else None,
        "guard_counts": tally.guards or None,
        "wall_s": clock.wall_s(),
        # CPU time of this process: the unloaded wall time of a single-threaded run
        "cpu_s": clock.cpu_s(),
        "torch_threads": torch.get_num_threads(),
        "device": str(run.device),
        "numerics": numerics_record(),  # pinned or native CPU kernels: rpka.numerics
    } | ({"data_seeds": data_seeds_of(run_config)} if run.per_member else {})
