"""Running a method end to end in a run directory: plan, fit, check the budget, release."""
from __future__ import annotations

import contextlib
import copy
import json
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from .api import dataset_from_config, stored_config, validate_config
from .autoplan.plan import budget_held
from .autoplan.regime import Assessment
from .autoplan.rules import parse_duration
from .config import (
    Config,
    DatasetSettings,
    PlanSettings,
    PrivacySettings,
    ReleaseSettings,
    RunConfig,
    RunSettings,
    SamplingSettings,
    build_config,
    check_not_run_written,
    flat_keys,
    get_value,
    has_key,
    method_name,
    schema_of,
    set_value,
)
from .data import Dataset, DatasetInfo
from .data.fingerprints import check_disjoint
from .datasheet import datasheet, unit_name
from .diffusion.settings import sample_steps
from .distributed import World
from .errors import ConfigError, DpsynthError, OutOfMemory, PrivacyError, PrivacyWarning
from .evaluation import EvaluationSettings, evaluate_release, load_release, read_release, selection_ledger
from .hardware import AUTO, hardware_choices, thread_governor
from .methods import create_method, get_method, run_config_of
from .methods.base import Method
from .models.upscaler import SavedUpscaler
from .officer import OFFICER_PAGE, near_chance, write_officer_page
from .planning import (
    BudgetPlan,
    check_total_epsilon,
    check_training_regime,
    data_key,
    format_derived_plan,
    holder_ledger,
    method_budget,
    planned_config,
    planned_release,
    release_upscaler,
    resolve_delta,
    training_dataset,
    training_regime,
    with_noisy_size,
    with_public_size,
)
from .privacy import (
    Accountant,
    LedgerPlan,
    PrivacyLedger,
    budget_report,
    check_within_plan,
    ledger_report,
    non_private_stages,
)
from .privacy.dataset_facts import draws_noisy_shape, record_drawn, with_noisy_shape
from .privacy.randomness import SecretStream, mersenne_state, secret_generator, stream_key
from .privacy.releases import total
from .provenance import provenance, public_data_digests
from .report import write_run_report
from .runs import (
    CHECKPOINT,
    CONFIG,
    LOG,
    PRIVACY,
    REHEARSAL,
    RELEASE,
    SYNTHETIC,
    Checkpoint,
    RunDirectory,
    inside_release,
)
from .training.context import RunContext
from .utils.device import pick_device
from .utils.messages import tell, warn

NEIGHBOURING = "add-remove"  # the guarantee's relation: data sets that differ by adding or removing one record


@dataclass
class Run:
    """A run prepared before anything is spent: its configuration planned (a :class:`~dpsynth.config.RunConfig`),
    its training data loaded once, its method built once and, for a new run, its budget calibrated and the recorded
    outcomes' verdict on its DP-SGD (``regime``). :meth:`prepare` makes one of a configuration, :meth:`reopen` of a
    stopped run's directory; :meth:`execute` runs its phases (fit, release, evaluate) and returns the directory."""

    config: RunConfig
    dataset: Dataset
    method: Method
    world: World
    budget: BudgetPlan
    regime: list[Assessment] = field(default_factory=list)
    began: float | None = None  # the time.perf_counter() of the command, from which plan.time_budget counts
    directory: RunDirectory | None = None  # a new run's is created by execute

    @classmethod
    def prepare(cls, config: Mapping[str, Any], began: float | None = None) -> Run:
        """Load the data, draw what it decides, plan, build the method and calibrate the budget for ``config``;
        ConfigError for a plan the recorded outcomes say will not learn or over the holder's cap, before anything
        is spent or written. On every process torchrun started: rank 0 draws and plans for every rank. ``began``:
        the ``time.perf_counter()`` at which the caller's command began (default: now)."""
        began = time.perf_counter() if began is None else began
        check_not_run_written(flat_keys(config), "a new run's config:")
        validate_config(config)  # a dict built by hand is held to what resolve_config checks: no unknown key
        typed = run_config_of(config)
        device = pick_device(RunSettings.of(typed).device)
        world = World.from_environment(device)
        typed = world.broadcast_object(with_noisy_shape(typed) if world.is_main else None)
        full = dataset_from_config(typed)
        dataset = full
        if world.is_main:  # one plan for every rank: rank 0 probes its device and derives it
            typed, dataset = planned_config(typed, full, world.device(device), draw_size=True)
        typed = world.broadcast_object(typed if world.is_main else None)
        dataset = training_dataset(typed, with_public_size(typed, dataset))
        method = create_method(typed)  # the run's one method, built from its plan
        budget = method_budget(method, dataset.info)
        regime = training_regime(method, dataset.info, budget)
        check_training_regime(typed, regime)  # before the run directory: nothing is spent on a refused plan
        check_total_epsilon(typed, dataset.info, budget, run="")  # likewise the holder's cap on all releases
        check_disjoint(method.public_fingerprints(dataset.info), dataset)
        if world.is_main:  # rank 0 alone builds (once, into the cache) and applies the release's upscaler
            check_upscaler(typed, dataset.info, full, world.device(device))
        return cls(typed, dataset, method, world, budget, regime, began)

    @classmethod
    def reopen(cls, path: str, overrides: Iterable[tuple[str, Any]] = ()) -> Run:
        """The stopped run in ``path``, to continue from its last checkpoint (ledger and RNG included), with
        ``overrides`` of :func:`resume_settings` (written to its config.yaml and log)."""
        run = resumable(path)
        config, overrides = run.config(), list(overrides)
        allowed = resume_settings(config)
        for key, value in overrides:
            if not _resume_setting(key, allowed):
                raise ConfigError(f"--set {key}: a resumed run can change only {', '.join(allowed)} (where and "
                                  "in what chunks it computes, and whether the release holds the model); the rest of "
                                  "its config is what its privacy plan covers")
            set_value(config, key, value, f"--resume {path}")
        validate_config(config)  # release.model=true for a method that has no model to release, say
        typed = run_config_of(config)
        world = World.from_environment(pick_device(RunSettings.of(typed).device))
        typed = world.broadcast_object(_with_shape(run, typed) if world.is_main else None)  # one draw for every rank
        full = dataset_from_config(typed)
        dataset = training_dataset(typed, full)
        typed = world.broadcast_object(_with_size(run, typed, dataset) if world.is_main else None)
        dataset = with_public_size(typed, dataset)
        method = create_method(typed)
        check_disjoint(method.public_fingerprints(dataset.info), dataset)
        if world.is_main:
            check_upscaler(typed, dataset.info, full, world.device(pick_device(RunSettings.of(typed).device)))
        if overrides and world.is_main:
            run.write_config(typed)
            run.log("resume settings", **dict(overrides))
        return cls(typed, dataset, method, world, method_budget(method, dataset.info), directory=run)

    def execute(self) -> RunDirectory:
        """Fit, release and evaluate, in a new run directory unless it has one (reopened): on several processes every
        rank fits, rank 0 alone restores, writes, releases and evaluates. A derived plan's evaluation is held to its
        budget, counted from ``began`` (:func:`~dpsynth.autoplan.plan.budget_held`); a reopened run's evaluates as
        planned."""
        if self.directory is None:
            self.directory = RunDirectory(self.world.broadcast_object(
                str(RunDirectory.create(self.config).path) if self.world.is_main else None))
            if self.world.is_main:
                self._tell_plan(self.directory)
        fitting = time.perf_counter()
        with _naming(self.directory):
            try:
                context = self._fit(fitting if self.began is None else self.began)
            finally:
                self.world.close()
            if self.world.is_main:
                lifted = _release(self.directory, self.method, context, self.budget)
                clock = None if self.began is None else (self.began, fitting)
                _evaluate(self.directory, self.config, context, lifted, clock)
        return self.directory

    def _fit(self, began: float) -> RunContext:
        """Fit the method within ``run.time_limit`` of ``began`` (the ``time.perf_counter()`` at which the command
        began) where one is set, its ledger restored from the last checkpoint, on the context it returns."""
        run, config, dataset, world, budget = self.directory, self.config, self.dataset, self.world, self.budget
        assert run is not None
        accountant, delta, plan = budget.accountant, budget.delta, budget.stages
        settings = fixed_settings(run.config())  # as config.yaml holds them, which a resume compares
        run_settings = RunSettings.of(config)
        state, ledger = _restored(run, world, settings, LedgerPlan(plan, run_settings.allow_non_private))
        if world.is_main and not run.file(REHEARSAL).exists():  # a rehearsal on public data enters no holder's ledger
            _enter_release(run, config, dataset.info, budget)
        record_drawn(ledger, plan)  # the dataset's facts, drawn before the first checkpoint
        if world.is_main:
            run.log("start" if state is None else "resume", plan=budget_report(plan, accountant, delta)["stages"],
                    processes=world.size)
        seed = user_seed(config)
        keys = world.broadcast_object({purpose: stream_key(seed, purpose) for purpose in ("noise", "training", "init")}
                                      if world.is_main else None)
        torch.default_generator.set_state(mersenne_state(keys["init"]))  # model initialisation
        device = world.device(pick_device(run_settings.device))
        if world.is_main:
            run.record_hardware(hardware_choices(config, device, sample_steps(config)))
            _log_groups(run, dataset, config)
        context = RunContext(dataset=dataset, run=run, ledger=ledger, accountant=accountant, delta=delta, device=device,
                             generator=secret_generator(keys["training"]), noise=SecretStream(keys["noise"]),
                             state=state, world=world, governor=thread_governor(run_settings.threads),
                             settings=settings, group_cap=PrivacySettings.of(config).max_images_per_group,
                             deadline=None if run_settings.time_limit is None else
                             began + parse_duration(run_settings.time_limit, "run.time_limit"),
                             expected=dict(config.derived.expected_seconds or {}))
        self.method.fit(context)
        return context

    def _tell_plan(self, directory: RunDirectory) -> None:
        info = self.dataset.info
        tell("run directory", f"run directory: {directory.path}", path=str(directory.path))
        if info.shape_decision:
            tell("shape", f"{info.name} read at {info.shape_decision}")
        tell("unit of privacy", f"unit of privacy: {info.unit_words()}")
        if self.config.derived.decisions:
            tell("derived plan", format_derived_plan(self.config))
        for assessment in self.regime:
            tell("training regime", "\n".join(assessment.lines()))


def start(config: Mapping[str, Any], began: float | None = None) -> RunDirectory:
    """Prepare a run of ``config`` (:meth:`Run.prepare`: config errors leave nothing behind), then create its run
    directory and execute it."""
    return Run.prepare(config, began).execute()


def check_upscaler(config: RunConfig, info: DatasetInfo, full: Dataset, device: torch.device) -> None:
    """Where training reads the images smaller than the release: the upscaler exists for the release's side and
    holds none of the private images (``full``, at that side); ConfigError for ``release.model``, whose generator
    draws at the training side."""
    upscaler = release_upscaler(config, info, device)
    if upscaler is None:
        return
    if ReleaseSettings.of(config).model:
        raise ConfigError(f"release.model: training reads the images at {info.height} px and the release is lifted "
                          f"to {info.release_side} px by an upscaler, which the released model does not hold; "
                          f"leave release.model unset, or train at the data's side (dataset.train_resolution="
                          f"{info.release_side})")
    check_disjoint({f"release.upscaler {upscaler.name!r}": upscaler.fingerprints()}, full)


def resumable(path: str) -> RunDirectory:
    """The run directory ``path``, its config.yaml given the keys added since it was written (at their defaults);
    DpsynthError if it is none, its config is damaged or it has released already."""
    run = RunDirectory.open(path)
    config = stored_config(run.config(), str(run.file(CONFIG)))
    if run.file(REHEARSAL).exists():
        raise DpsynthError(f"{run.path}: a rehearsal does not resume; run dpsynth rehearse again (it spends nothing)")
    if run.file(PRIVACY).exists():
        raise DpsynthError(f"{run.path}: this run already released its synthetic set; nothing to resume "
                           f"(dpsynth evaluate {run.path} evaluates it)")
    written = yaml.safe_load(run.file(CONFIG).read_text())
    added = [key for key in flat_keys(config) if not has_key(written, key)]
    if added or schema_of(written) != schema_of(config):
        run.write_config(run_config_of(config))
        run.log("config completed", schema=schema_of(config), added=added)
    return run


# What a resumed run of any method may change: where and in what chunks it computes and whether the release holds
# the model, never what it computes (the privacy plan, the model); a method declares its own (resume_settings).
RESUME_SETTINGS = ("run.device", "run.threads", "run.time_limit", "sampling.batch_size", "*.physical_batch_size",
                   "release.model")


def resume_settings(config: Config) -> tuple[str, ...]:
    """The keys a resumed run of ``config``'s method may change."""
    return (*RESUME_SETTINGS, *get_method(method_name(config)).declaration.resume_settings)


def _resume_setting(key: str, allowed: tuple[str, ...]) -> bool:
    """Whether ``key`` is one of the ``allowed`` keys (:func:`resume_settings`; ``*`` stands for any section)."""
    return key in allowed or (key.endswith(".physical_batch_size") and key.count(".") == 1)


def fixed_settings(config: Config) -> dict[str, Any]:
    """Every key of ``config`` a resumed run must keep (all but :func:`resume_settings`, the evaluation's and
    the machine's), with its value: each checkpoint stores them, and a resume whose config.yaml differs stops."""
    allowed = resume_settings(config)
    return {key: get_value(config, key) for key in flat_keys(config) if not (
        _resume_setting(key, allowed) or key.startswith(("evaluation.", "hardware.")) or key == "run.out_dir")}


def resume(path: str, overrides: Iterable[tuple[str, Any]] = ()) -> RunDirectory:
    """Continue the run in ``path`` from its last checkpoint (:meth:`Run.reopen`) and execute it."""
    return Run.reopen(path, overrides).execute()


@contextlib.contextmanager
def _naming(run: RunDirectory) -> Iterator[None]:
    """Stops that tell the user how to continue name the run's directory: Ctrl-C or SIGTERM (the command line
    reads ``run_directory``) and running out of memory."""
    try:
        yield
    except KeyboardInterrupt as interrupt:
        interrupt.run_directory = run.path  # type: ignore[attr-defined]
        raise
    except OutOfMemory as error:
        raise error.in_run(run.path) from None


def _restored(run: RunDirectory, world: World, settings: dict[str, Any], plan: LedgerPlan
              ) -> tuple[Checkpoint | None, PrivacyLedger]:
    """Rank 0's restored checkpoint state and ledger, made with ``plan``, on every rank (the others' ledger is
    in memory only); DpsynthError naming the key when the config's ``settings`` differ from the checkpoint's."""
    if world.is_main:
        state, ledger = run.restore(settings, plan)
        world.broadcast_object((state, ledger.to_dict()))
        return state, ledger
    received: tuple[Checkpoint | None, dict[str, Any]] = world.broadcast_object(None)
    return received[0], PrivacyLedger.from_dict(received[1], plan=plan)


def _with_shape(run: RunDirectory, config: RunConfig) -> RunConfig:
    """The run's config with its shape drawn by the DP vote and written to config.yaml where the vote decides it and
    none was drawn yet (a bench cell before its first start); DpsynthError for a run that trained at a shape the exact
    images chose (started by a dpsynth before the vote): it cannot resume under the rule that keeps the shape
    private."""
    if not draws_noisy_shape(config) or config.drawn.shape is not None:
        return config
    if run.file(CHECKPOINT).exists():
        raise DpsynthError(f"{run.path}: this run was started by a dpsynth that read the folder at the shape its exact "
                           "images chose (dataset.resolution or dataset.channels auto, no drawn.shape); it "
                           "cannot resume under the rule that decides the shape by a DP vote: start it again, or "
                           "declare the shape (dataset.resolution, dataset.channels) for the new run")
    config = with_noisy_shape(config)
    run.write_config(config)
    return config


def _enter_release(run: RunDirectory, config: RunConfig, info: DatasetInfo, budget: BudgetPlan) -> None:
    """Enter the run in the holder's ledger at its plan before its first mechanism, once the holder's cap
    (``privacy.total_epsilon``) allows it; a run entered before (resumed) is left as it stands."""
    path = str(run.path.resolve())
    if any(entry.run == path for entry in holder_ledger(config).releases()):
        return
    check_total_epsilon(config, info, budget, path)
    holder_ledger(config).begin(planned_release(config, info, budget, path))


def _released(run: RunDirectory, config: RunConfig, ledger: PrivacyLedger, report: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the run's entry in the holder's ledger with what it spent; for privacy.json, where the release stands
    among every release from the same data: its number, how many count, and their ε composed."""
    path, held = str(run.path.resolve()), holder_ledger(config)
    held.release(path, ledger.stages(), report["epsilon"])
    every = held.releases(data_key(config))
    counted = [entry for entry in every if entry.shared]
    together = total(counted, report["accountant"])
    return {"number": [entry.run for entry in every].index(path) + 1, "listed": len(every), "counted": len(counted),
            "running": sum(entry.status == "running" for entry in counted), "epsilon": together.epsilon,
            "delta": together.delta, "accountant": together.accountant}


def _with_size(run: RunDirectory, config: RunConfig, dataset: Dataset) -> RunConfig:
    """``config`` with a noisy count of the private set's size drawn and written to config.yaml
    (``drawn.dataset_size``) when the size is not public and none was drawn yet (a bench cell before its first
    start)."""
    drawn = with_noisy_size(config, dataset)
    if drawn is config:
        return config
    if run.file(CHECKPOINT).exists():
        raise DpsynthError(f"{run.path}: this run was started by a dpsynth that planned with the exact size of "
                           "private data; it cannot resume under the rule that keeps that size private: start it "
                           "again")
    run.write_config(drawn)
    return drawn


def user_seed(config: RunConfig) -> int | None:
    """``run.seed`` when the user set one (with a warning: the noise is then recomputable), else None."""
    seed = RunSettings.of(config).seed
    if seed is not None:
        warnings.warn(f"run.seed = {seed} is set: whoever knows it can recompute this run's noise, so its release "
                      "is NOT private (privacy.json says noise_seed: user-set); leave run.seed unset for a real "
                      "release", PrivacyWarning, stacklevel=2)
    return seed


def _release(run: RunDirectory, method: Method, context: RunContext, budget: BudgetPlan) -> bool:
    """Check the ledger against the target, generate, write the release and its privacy report; whether an
    upscaler lifted it past the side training read."""
    config, dataset, ledger, delta = method.config, context.dataset, context.ledger, budget.delta
    accountant, target = budget.accountant, budget.target
    run_settings = RunSettings.of(config)
    check_within_plan(ledger.stages(), budget.stages, run_settings.allow_non_private, complete=not context.stopped)
    report = {**_privacy_report(ledger, accountant, delta, target, dataset.info, method, config),
              **({"stopped_early": context.stopped} if context.stopped else {}),
              "training_regime": _regime_report(method, dataset.info, budget),
              "dpsynth": provenance(), "released": time.strftime("%Y-%m-%d", time.gmtime()),
              "public_data": public_data_digests(method.public_fingerprints(dataset.info)),
              **method.report_sections(dataset.info)}
    if run.file(REHEARSAL).exists():
        report["rehearsal"] = json.loads(run.file(REHEARSAL).read_text())
    else:
        report["releases"] = _released(run, config, ledger, report)
    release_stream = secret_generator(stream_key(run_settings.seed, "release"))
    start = time.perf_counter()
    generated = method.generate(SamplingSettings.of(config).num_samples, release_stream)
    upscaler = release_upscaler(config, dataset.info, context.device)
    images = generated.images if upscaler is None else upscaler.lift(generated.images, upscaler.record["side"],
                                                                        context.device)
    if upscaler is not None:
        report["upscaling"] = upscaling_report(upscaler, dataset.info)
        report["public_data"] |= public_data_digests({f"release.upscaler {upscaler.name!r}": upscaler.fingerprints()})
    seconds = round(time.perf_counter() - start, 1)
    run.save_release(images, generated.labels, dataset.info.class_names, generated.soft_labels,
                     method.soft_label_temperature())
    model = method.trained_generator() if ReleaseSettings.of(config).model else None
    if model is not None:
        model.save(run.file(RELEASE), report["dpsynth"])
    run.write_datasheet(datasheet(report, method, dataset.info, generated.labels.cpu().numpy(),
                                  generated.soft_labels is not None, method.config, model))
    run.write_privacy_report(report)
    run.forget_noise_keys()
    write_run_report(run)
    write_officer_page(run)
    run.log("released", epsilon=report["epsilon"], samples=len(generated.labels), sampling_seconds=seconds,
            **generated.sampling, **_cuda_peak(context.device))
    guarantee = (f"at epsilon = {report['epsilon']:.4f} (delta = {delta:.3g})" if report["dp_guarantee"] else
                 "with NO differential-privacy guarantee (see privacy.json)")
    if "rehearsal" in report:
        guarantee = "of the rehearsal: a public stand-in's, no private image read, nothing spent"
    tell("released", f"released {len(generated.labels)} images {guarantee}: {run.path}", epsilon=report["epsilon"],
         images=len(generated.labels), path=str(run.path))
    return upscaler is not None


def _evaluate(run: RunDirectory, config: RunConfig, context: RunContext, lifted: bool,
              clock: tuple[float, float] | None) -> None:
    """Evaluate the release where the run's evaluation is enabled, against the real images at the release's side
    (read again where it was ``lifted``), within a derived plan's budget by the ``clock`` (when the command and the
    fitting began)."""
    if EvaluationSettings.of(config).enabled:
        cuts = _held_evaluation(run, config, context.dataset.info, context.device, clock)
        evaluate_run(run, cuts.items(), dataset=None if lifted else context.dataset, device=context.device)


def _held_evaluation(run: RunDirectory, config: RunConfig, info: DatasetInfo, device: torch.device,
                     clock: tuple[float, float] | None) -> dict[str, Any]:
    """The evaluation keys cut to hold a derived plan's budget (said and logged), by the ``clock`` of the command
    that started the run; none for a resumed run, whose budget its stop broke."""
    if clock is None:
        return {}
    now = time.perf_counter()
    cuts, words = budget_held(config, info, device, now - clock[0], now - clock[1])
    if cuts:
        tell("evaluation held to the budget", words, cuts=cuts)
        run.log("evaluation held to the budget", cuts=cuts, decision=words)
    return cuts


def upscaling_report(upscaler: SavedUpscaler, info: DatasetInfo) -> dict[str, Any]:
    """For privacy.json: the side training read the images at, the side the release was lifted to, and the model
    that lifted it (by name and the SHA-256 of its weights), which saw no private image."""
    return {"private_side": info.height, "release_side": info.release_side, "upscaler": upscaler.name,
            "upscaler_sha256": upscaler.weights_sha256, "trained_on": upscaler.record.get("trained_on"),
            "public_images": upscaler.record.get("images"), "private_images_seen": 0,
            "composition": "post-processing of the images the DP mechanisms made: no further epsilon"}


def _regime_report(method: Method, info: DatasetInfo, budget: BudgetPlan) -> list[dict[str, Any]]:
    """For privacy.json: each DP-SGD plan's noise per example, steps and side, the recorded outcomes' verdict on
    them (:func:`~dpsynth.planning.training_regime`), the record that decided it and whether ``plan.force`` ran it."""
    forced = PlanSettings.of(method.config).force
    return [{"stage": item.plan.stage, "noise_per_example": round(item.plan.noise_per_example, 6),
             "steps": item.plan.steps, "side": item.plan.side, "start": item.plan.start, "verdict": item.verdict,
             "deciding_record": item.deciding[0].record if item.deciding else None,
             "forced": forced and item.verdict == "fails"} for item in training_regime(method, info, budget)]


def _cuda_peak(device: torch.device) -> dict[str, int]:
    """The process's peak CUDA memory allocated on ``device`` (nothing on the CPU), for the log."""
    return {"cuda_peak_bytes": torch.cuda.max_memory_allocated(device)} if device.type == "cuda" else {}


def _evaluation_config(config: Config, overrides: Iterable[tuple[str, Any]]) -> Config:
    """A copy of ``config`` with ``overrides`` of its evaluation (and the device it runs on)."""
    config = copy.deepcopy(config)
    for key, value in overrides:
        if not key.startswith(("evaluation.", "run.device")):
            raise ConfigError(f"--set {key}: evaluating a run can change evaluation.* and run.device only")
        set_value(config, key, value)
    return config


def evaluate_run(run: RunDirectory, overrides: Iterable[tuple[str, Any]] = (), dataset: Dataset | None = None,
                 device: torch.device | None = None) -> dict[str, Any]:
    """Evaluate a run's release into its directory (never into ``release/``); model selection is recorded in the
    validation split's ledger (:func:`~dpsynth.evaluation.release.selection_ledger`), whose total metrics.json
    and report.html show."""
    if not run.file(SYNTHETIC).is_file():
        raise DpsynthError(f"{run.path}: no {SYNTHETIC} yet; finish the run first (dpsynth run --resume {run.path})")
    config = run_config_of(_evaluation_config(run.config(), overrides))
    dataset = dataset or dataset_from_config(config)
    accountant, delta = Accountant(PrivacySettings.of(config).accountant), resolve_delta(config, dataset.info.num_train)
    selection = selection_ledger(dataset, DatasetSettings.of(config).split_seed)
    device = device or pick_device(RunSettings.of(config).device)
    with _naming(run):
        metrics = evaluate_release(load_release(run.file(SYNTHETIC), dataset.info), dataset,
                                   EvaluationSettings.of(config), selection, accountant, delta, run.path, device,
                                   run.file(LOG), run.method_metrics())
    write_run_report(run)
    write_officer_page(run)
    for name, result in metrics.get("accuracy", {}).items():
        if near_chance(result["test_accuracy"], dataset.info.num_classes):
            warn("near chance", f"dpsynth: warning: a {name} classifier trained on the release scores "
                 f"{100 * result['test_accuracy']:.1f} % on the real test images, near chance "
                 f"({100 / dataset.info.num_classes:.1f} %): the release shows almost nothing of the classes "
                 f"({run.file(OFFICER_PAGE)} says so to the officer)", classifier=name)
    run.log("evaluated", **{key: metrics[key] for key in ("fid", "precision", "recall")}, **_cuda_peak(device))
    return metrics


def evaluate_file(path: str | Path, overrides: Iterable[tuple[str, Any]], out_dir: str | Path | None = None
                  ) -> tuple[dict[str, Any], Path]:
    """Evaluate a synthetic .npz against ``dataset.*`` from ``overrides``; outputs go to ``out_dir``.

    The default ``out_dir`` is ``<file stem>-evaluation`` beside the file, or in the run directory when the file
    lies in a run's ``release/`` folder: the outputs show real images, and nothing but the release step writes
    there (ConfigError for an ``out_dir`` inside one). The model-selection mechanisms (evaluation budget) go to
    the validation split's ledger (:func:`~dpsynth.evaluation.release.selection_ledger`), so they accumulate over
    every evaluation that selects on the same private records.
    """
    path = Path(path)
    config = RunConfig.shared(_at_release_shape(build_config({}, {}, "none", overrides), path))
    dataset = dataset_from_config(config)
    run = inside_release(path)
    out = Path(out_dir) if out_dir is not None else (run or path.parent) / f"{path.stem}-evaluation"
    if inside_release(out) is not None:
        raise ConfigError(f"--out {out}: that is inside a run's {RELEASE}/ folder, which holds only what may be "
                          "shared; the evaluation shows real training images: give --out a folder outside it")
    release = load_release(path, dataset.info)
    ledger = selection_ledger(dataset, DatasetSettings.of(config).split_seed)
    accountant, delta = Accountant(PrivacySettings.of(config).accountant), resolve_delta(config, dataset.info.num_train)
    metrics = evaluate_release(release, dataset, EvaluationSettings.of(config), ledger, accountant, delta, out,
                               pick_device(RunSettings.of(config).device))
    return metrics, out


def _at_release_shape(config: Config, path: Path) -> Config:
    """``config`` with the shape settings a folder's images would vote on (left auto) set to the release's, which
    is public: the real images are read at the shape the release was made at."""
    if not draws_noisy_shape(RunConfig.shared(config)):
        return config
    _, channels, side, _ = read_release(path).images.shape
    settings = DatasetSettings.of(config)
    for key, value in (("resolution", side), ("channels", channels)):
        if getattr(settings, key) == AUTO:
            set_value(config, f"dataset.{key}", int(value), "the release's shape")
    return config


def _log_groups(run: RunDirectory, dataset: Dataset, config: RunConfig) -> None:
    """With groups: how many the training split has and how many hold more images than a step reads (private)."""
    groups = dataset.train.groups
    if groups is None:
        return
    sizes = torch.bincount(torch.unique(groups, return_inverse=True)[1])
    cap = PrivacySettings.of(config).max_images_per_group
    run.log("groups", train_groups=len(sizes), largest=int(sizes.max()), capped=int((sizes > cap).sum()), cap=cap)


def _unit(info: DatasetInfo, config: RunConfig) -> str:
    """What one record is, in words: an image, or a group of images (dataset_size then counts groups)."""
    if info.unit == "image":
        return "one image"
    cap, name = PrivacySettings.of(config).max_images_per_group, unit_name(info, DatasetSettings.of(config))
    source = f", from {info.group_source}" if info.group_source else ""
    return (f"one {name} (all of a {name}'s images{source}): each DP-SGD step reads "
            f"at most {cap} of a {name}'s images; every other mechanism weighs a {name}'s images 1 / their number")


def _privacy_report(ledger: PrivacyLedger, accountant: Accountant, delta: float, target: float,
                    info: DatasetInfo, method: Method, config: RunConfig) -> dict[str, Any]:
    """The ledger's epsilon (PrivacyError over ``target``), plus any outputs the method says it does not cover
    and whether the noise was seeded by the user (then recomputable). The neighbouring relation is adding or
    removing one record; the training set's size shown is the public one planning used (PrivacyError if there is
    none: the exact size of private data is never released)."""
    if info.size_rule == "private":
        raise PrivacyError("the training set's size is not public (no published, declared or noisy size): it "
                           "cannot be shown in a release; nothing is released")
    seeded = "user-set" if RunSettings.of(config).seed is not None else "secret"
    size = {"neighbouring": NEIGHBOURING, "unit": _unit(info, config), "dataset_size": info.num_train,
            "dataset_size_rule": info.size_rule}
    report = {**ledger_report(ledger, accountant, delta), "noise_seed": seeded}
    if not report["dp_guarantee"]:  # allowed by run.allow_non_private when planned
        unprotected = ", ".join(non_private_stages(ledger.stages()))
        return {"target_epsilon": None, **size, **report,
                "no_guarantee": f"stage(s) {unprotected} used the private data without noise: no epsilon covers "
                                "this release, whatever noise the other stages added"}
    if report["epsilon"] > target * (1 + 1e-6):
        raise PrivacyError(f"the ledger spends epsilon = {report['epsilon']:.4f}, over the target {target:g}: "
                           "nothing is released")
    uncovered = {"not_covered_by_epsilon": method.non_private_outputs()} if method.non_private_outputs() else {}
    return {"target_epsilon": target, **size, **report, **uncovered}
