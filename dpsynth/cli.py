"""The ``dpsynth`` command line."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import (
    DatasetSettings,
    SamplingSettings,
    build_config,
    method_name,
    parse_overrides,
    preset_name,
)
from .diffusion.settings import SAMPLER_NAMES, PretrainSettings
from .errors import AuditCrash, AuditFailure, DpsynthError
from .methods import METHODS, create_method, run_config_of, shortcuts
from .provenance import version_line
from .utils.messages import printed_to

if TYPE_CHECKING:
    from .data import Dataset

# The handlers import what they need: `dpsynth --help` and a bad argument answer without importing torch.


def _data_list(args: argparse.Namespace) -> None:
    from .data import DATASETS

    width = max(map(len, DATASETS))
    for source in DATASETS.values():
        print(f"{source.name:<{width}}  {source.description}\n{'':<{width}}  from: {source.location}")


def _load_dataset(name: str, data_dir: str | None, overrides: list[str]) -> Dataset:
    """Dataset ``name`` (from ``data_dir`` when given) with ``dataset.*`` overrides."""
    from .api import dataset_from_config

    pairs = [("dataset.name", name)] + parse_overrides(overrides)
    if data_dir:
        pairs.append(("dataset.data_dir", data_dir))
    return dataset_from_config(build_config({}, {}, "none", pairs))


def _data_info(args: argparse.Namespace) -> None:
    from .data import DATASETS

    dataset = _load_dataset(args.name, args.data_dir, args.set)
    info = dataset.info
    print(f"name:     {info.name}")
    print(f"found at: {info.source}")
    print(f"shape:    {info.channels} x {info.height} x {info.width} (C x H x W), values in [0, 1]")
    if info.shape_decision:
        print(f"decided:  {info.shape_decision}")
    elif DATASETS[info.name].shape_votes is not None:
        print("decided:  as declared (dataset.resolution, dataset.channels): public, no epsilon spent")
    print(f"classes:  {info.num_classes}: {', '.join(info.class_names)}")
    sizes = ", ".join(f"{name} {count}" for name, count in info.split_sizes.items())
    print(f"splits:   {sizes} (train and val are private; val is used only through DP selection)")
    if info.group_counts is not None:
        groups = ", ".join(f"{name} {count}" for name, count in info.group_counts.items())
        print(f"groups:   {groups} (no group on two sides)")
    print(f"unit:     {info.unit_words()}")
    if info.pixel_rule:
        print(f"pixels:   {info.pixel_rule}")
    if info.skipped:
        shown = ", ".join(info.skipped[:3]) + (f" and {len(info.skipped) - 3} more" if len(info.skipped) > 3 else "")
        print(f"skipped:  {len(info.skipped)} file(s) of no image format ({shown})")
    print(f"planning: {f'N = {info.num_train} {info.unit}s, ' if info.size_rule != 'private' else ''}"
          f"{SIZE_WORDS[info.size_rule]} (privacy.dataset_size)")


def _number(value: float | None, width: int) -> str:
    """``value`` right-aligned to 4 decimals; "none" for None (noise-free use: no epsilon, no noise)."""
    return f"{value:>{width}.4f}" if value is not None else f"{'none':>{width}}"


SIZE_WORDS = {"published": "published size", "declared": "declared public", "noisy": "a noisy count",
              "private": "exact, private: a run plans with a noisy count near it"}


def _format_plan(plan: dict[str, Any], config: Mapping[str, Any]) -> str:
    lines = [
        f"{method_name(config)} on {DatasetSettings.of(config).name} (N = {plan['dataset_size']}, "
        f"{SIZE_WORDS[plan['dataset_size_rule']]}), preset {preset_name(config)}, accountant {plan['accountant']}",
        f"target epsilon = {plan['target_epsilon']:g} at delta = {plan['delta']:.3g}",
        f"{'stage':<20}{'mechanism':<22}{'noise mult.':>12}{'sample rate':>13}{'steps':>8}"
        f"{'eps share':>11}{'eps alone':>11}",
    ]
    for stage in plan["stages"]:
        for index, part in enumerate(stage["mechanisms"]):
            row = (f"{stage['name'] if index == 0 else '':<20}{part['mechanism']:<22}"
                   f"{_number(part['noise_multiplier'], 12)}{part['sample_rate']:>13.5g}{part['steps']:>8}")
            if index == 0:
                row += _number(stage["epsilon_share"], 11) + _number(stage["epsilon_alone"], 11)
            lines.append(row)
    lines.append(f"total epsilon = {plan['epsilon']:.4f}" if plan["dp_guarantee"] else
                 "total epsilon: none, NO differential-privacy guarantee (a stage uses the data without noise)")
    return "\n".join(lines)


def _pretrain_part(args: argparse.Namespace) -> None:
    """``dpsynth pretrain --upscaler`` or ``--autoencoder``: a release's upscaler, or DP-LDM's autoencoder, trained on
    a public dataset at its resolution."""
    from .utils.device import pick_device

    option = "--upscaler" if args.upscaler else "--autoencoder"
    if args.upscaler and args.autoencoder:
        raise DpsynthError("give --upscaler or --autoencoder, not both: each trains its own public part")
    if args.for_method or args.preset or any(not item.startswith("dataset.") for item in args.set):
        raise DpsynthError(f"{option} trains a public part of a run: give it --dataset, --out, --iterations, "
                           "--batch-size, --lr and --set dataset.*, not --for, --preset or model keys")
    dataset = _load_dataset(args.dataset, args.data_dir, args.set)
    side, device, described = dataset.info.height, pick_device(args.device or "auto"), \
        f"dataset {args.dataset} ({dataset.info.source})"
    if args.upscaler:
        from .training.upscaler import UpscalerTraining, train_upscaler
        upscaling = UpscalerTraining(iterations=args.iterations or UpscalerTraining.iterations,
                                     batch_size=args.batch_size or UpscalerTraining.batch_size,
                                     lr=args.lr or UpscalerTraining.lr)
        upscaler = train_upscaler([dataset.train], side, args.out, upscaling, device, Path(args.out).name, described)
        folder, sha256 = upscaler.folder, upscaler.weights_sha256
        what, use = f"an upscaler to {side} px", f"release.upscaler={folder}"
    else:
        from .models.autoencoder import default_shape
        from .training.autoencoder import AutoencoderTraining, train_autoencoder
        encoding = AutoencoderTraining(iterations=args.iterations or AutoencoderTraining.iterations,
                                       batch_size=args.batch_size or AutoencoderTraining.batch_size,
                                       lr=args.lr or AutoencoderTraining.lr)
        autoencoder = train_autoencoder([dataset.train], args.out, encoding, default_shape(side), device,
                                        Path(args.out).name, described)
        folder, sha256 = autoencoder.folder, autoencoder.weights_sha256
        what, use = f"an autoencoder of {side} px images", f"autoencoder.path={folder}"
    print(f"saved {what} trained on {len(dataset.train)} public {args.dataset} images: {folder} (weights' "
          f"SHA-256 {sha256})")
    print(f"use it: dpsynth run {'METHOD' if args.upscaler else 'dp-ldm'} --set {use} ...")


def _pretrain(args: argparse.Namespace) -> None:
    from .api import resolve_config
    from .data.fingerprints import fingerprints
    from .diffusion.pretrain import pretrain
    from .utils.device import pick_device

    if args.upscaler or args.autoencoder:
        _pretrain_part(args)
        return
    dataset_keys = [item for item in args.set if item.startswith("dataset.")]
    method_keys = [item for item in args.set if not item.startswith("dataset.")]
    training: dict[str, Any] = {"iterations": args.iterations or PretrainSettings.iterations,
                                "batch_size": args.batch_size or PretrainSettings.batch_size,
                                "lr": args.lr or PretrainSettings.lr}
    if args.for_method:
        if args.for_method not in _starts_from_public():
            raise DpsynthError(f"--for {args.for_method}: it does not start from a diffusion model; methods that do: "
                               f"{', '.join(_starts_from_public())}")
        config = run_config_of(resolve_config(args.for_method, preset=args.preset, overrides=method_keys))
        settings = PretrainSettings.for_method(config, **training)
    elif method_keys or args.preset:
        raise DpsynthError("--preset and --set of model / diffusion keys need --for METHOD (the method to fit)")
    else:
        settings = PretrainSettings(**training)
    dataset, device = _load_dataset(args.dataset, args.data_dir, dataset_keys), pick_device(args.device or "auto")
    data, extra = dataset.train, dict[str, Any]()
    if args.for_method:  # DP-LDM's public model learns the autoencoder's latents of the public images
        data, extra = create_method(config).pretraining_data(dataset.train, dataset.info, device)
    out = pretrain(data, args.out, settings, device, dataset.info.class_names, args.dataset,
                   training_prints=fingerprints(dataset.train.images), extra=extra)
    print(f"saved a diffusion model trained on {len(dataset.train)} public {args.dataset} images: {out}")
    if args.for_method:
        preset = f" --preset {args.preset}" if args.preset else ""
        print(f"start a run from it with: dpsynth run {args.for_method}{preset} --init-from {out} "
              "--dataset PRIVATE_DATASET")
    else:
        print(f"use it with: dpsynth run pe --api diffusion --api-model {out} --dataset PRIVATE_DATASET")


def _starts_from_public() -> list[str]:
    """The methods whose diffusion model can start from a public one (``model.init_from``)."""
    return sorted(name for name, method in METHODS.items() if "init_from" in method.defaults().get("model", {}))


def _privacy(args: argparse.Namespace) -> None:
    from .api import privacy_preview, resolve_config
    from .planning import format_derived_plan, with_earlier_releases

    preview = privacy_preview(resolve_config(args.method, dataset=args.dataset, epsilon=args.epsilon,
                                             preset=args.preset, data_dir=args.data_dir,
                                             overrides=_method_overrides(args)))
    config = preview.config
    if args.json:
        print(json.dumps(preview.to_dict(), indent=2))
    else:
        derived = config.derived.decisions
        print((format_derived_plan(config) + "\n" if derived else "") + _format_plan(preview.report, config))
        for line in (line for item in preview.regime for line in item.lines()):
            print(line)
        if preview.refused:
            print("dpsynth run refuses this plan (--set plan.force=true runs it anyway)")
        for line in preview.recommendation.lines() if preview.recommendation else []:
            print(line)
        print(f"unit of privacy: {preview.info.unit_words()}")
        together = with_earlier_releases(config, preview.info, preview.budget)
        if len(together.releases) > 1:
            print(f"with the {len(together.releases) - 1} earlier release(s) from this data (dpsynth budget), "
                  f"{together.words()}")


def _budget(args: argparse.Namespace) -> None:
    from .privacy.releases import HolderLedger, total

    ledger = HolderLedger(Path(args.ledger).expanduser() if args.ledger else None)
    for run, shared in ((args.not_shared, False), (args.shared, True)):
        if run:
            entry = ledger.mark(str(Path(run).expanduser().resolve()), shared)
            print(f"marked {'shared' if shared else 'never shared'}: {entry.run} (from {entry.data})")
    releases = ledger.releases()
    if args.data:
        path = Path(args.data).expanduser()
        wanted = f":{path.resolve()}" if path.exists() else None
        releases = [entry for entry in releases if entry.data == args.data or (
            wanted is not None and entry.data.endswith(wanted))]
    if not releases:
        print(f"no releases{f' from {args.data}' if args.data else ''} in the holder's ledger {ledger.path}")
        return
    print(f"the holder's ledger: {ledger.path}")
    for data in dict.fromkeys(entry.data for entry in releases):
        every = [entry for entry in releases if entry.data == data]
        print(f"\nreleases from {data}")
        print(f"{'#':>3}  {'started':<10}  {'released':<10}  {'method':<13} {'unit':<17} {'epsilon':>8}  "
              f"{'delta':>9}  {'status':<8}  shared  run")
        for number, entry in enumerate(every, 1):
            spent = "none" if entry.status == "released" and entry.epsilon is None else (
                f"{entry.epsilon:.4f}" if entry.epsilon is not None else "planned")
            print(f"{number:>3}  {entry.started:<10}  {entry.released or '-':<10}  {entry.method:<13} {entry.unit:<17} "
                  f"{spent:>8}  {entry.delta:>9.3g}  {entry.status:<8}  {'yes' if entry.shared else 'NO':<6}  "
                  f"{entry.run}")
        counted = [entry for entry in every if entry.shared]
        if counted:
            running = sum(entry.status == "running" for entry in counted)
            print(f"{len(counted)} counted (shared), {total(counted).words()}" + (
                f"; {running} not released yet, counted at its plan" if running else ""))
        units = {entry.unit for entry in counted}
        if "image" in units and len(units) > 1:
            print("note: these releases protect different units; a release whose unit is an image protects a "
                  "person with k images only as k records")


def _clean(args: argparse.Namespace) -> None:
    from .config import DatasetSettings
    from .data.folder import clear_cache
    from .evaluation.cache import default_cache_dir

    default = Path(str(DatasetSettings.cache_dir)).expanduser()
    folders = [default, *(Path(path).expanduser() for path in args.cache_dir)]
    features = default_cache_dir() / "features"
    for folder, what in [*((folder, "decoded private images") for folder in folders),
                         (features, "Inception features of real images")]:
        files, size = clear_cache(folder)
        print(f"{folder}: removed {files:,} file(s), {size / 2 ** 20:,.1f} MiB ({what})")
    print("kept: the holder's ledger of releases and the evaluation's selection ledgers (~/.local/share/dpsynth), "
          "the public upscalers and autoencoders, and every run directory (delete those you no longer need yourself)")


def _officer(args: argparse.Namespace) -> None:
    from .officer import officer_pdf, write_officer_page
    from .runs import PRIVACY, RunDirectory

    run = RunDirectory.open(args.run_dir)
    if not run.file(PRIVACY).is_file():
        raise DpsynthError(f"{run.path}: not released yet; the officer's page is written with the release")
    written = officer_pdf(run, Path(args.pdf)) if args.pdf else write_officer_page(run)
    print(f"wrote {written} (private: it holds the release's evaluation against the real images)")


def _without_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` less its ``--nproc N`` / ``--nproc=N``."""
    kept, skip = [], False
    for arg in argv:
        if not skip and not arg.startswith("--nproc"):
            kept.append(arg)
        skip = arg == "--nproc"
    return kept


def _run_processes(args: argparse.Namespace) -> None:
    """``dpsynth run --nproc N``: the same command in N processes on this machine, through torchrun's launcher.

    A failing rank prints its own one-line error; this ends with one line naming the failed ranks."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as torchrun

    if "WORLD_SIZE" in os.environ:
        raise DpsynthError("--nproc starts its own processes; under torchrun leave it out")
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # its failure report is a traceback
    launch = ["--standalone", f"--nproc_per_node={args.nproc}", "-m", "dpsynth", *_without_nproc(args.argv)]
    try:
        torchrun(get_args_parser().parse_args(launch))
    except ChildFailedError as exc:
        failed = ", ".join(f"{rank} (exit status {failure.exitcode})" for rank, failure in sorted(exc.failures.items()))
        raise DpsynthError(f"rank(s) {failed} of the {args.nproc} processes failed; their messages are above") from None


def _run(args: argparse.Namespace) -> None:
    began = time.perf_counter()  # plan.time_budget counts from here: the imports and the data are in it
    from .api import dataset_from_config, plan_budget_for, resolve_config
    from .evaluation import METRICS
    from .pipeline import resumable, resume, start

    if args.nproc < 1:
        raise DpsynthError(f"--nproc must be at least 1, got {args.nproc}")
    if args.resume:
        given = [option for option, value in (("METHOD", args.method), ("--dataset", args.dataset),
                                              ("--data-dir", args.data_dir), ("--epsilon", args.epsilon),
                                              ("--preset", args.preset)) if value]
        given += [option for option, _, value in _shortcut_values(args) if value]
        if given:
            raise DpsynthError(f"--resume takes its method and config from the run directory; leave out "
                               f"{', '.join(given)} (--device and --set of where and in what chunks it computes "
                               "may change)")
        if args.nproc > 1:
            resumable(args.resume)
            _run_processes(args)
            return
        extra = [f"run.device={args.device}"] if args.device else []
        extra += ["release.model=true"] if args.release_model else []
        run = resume(args.resume, parse_overrides(args.set + extra))
    elif not args.method:
        raise DpsynthError("dpsynth run needs a METHOD (or --resume RUN_DIR)")
    elif args.epsilon is None:
        raise DpsynthError("dpsynth run needs --epsilon (the target epsilon of the whole release; `dpsynth privacy "
                           "METHOD --epsilon E` shows what a value buys); --epsilon inf with --allow-non-private runs "
                           "without noise")
    else:
        overrides = _method_overrides(args) + ([f"run.device={args.device}"] if args.device else [])
        config = resolve_config(args.method, dataset=args.dataset, epsilon=args.epsilon, preset=args.preset,
                                data_dir=args.data_dir, overrides=overrides)
        if args.nproc > 1:
            plan_budget_for(config, dataset_from_config(config).info)  # bad input stops here, before any process
            _run_processes(args)
            return
        run = start(config, began)
    if os.environ.get("RANK", "0") == "0" and run.file(METRICS).exists():  # rank 0 writes the metrics
        print(_format_metrics(json.loads(run.file(METRICS).read_text())))


def _rehearse(args: argparse.Namespace) -> None:
    from .api import resolve_config
    from .evaluation import METRICS
    from .rehearsal import rehearse

    if args.epsilon is None:
        raise DpsynthError("dpsynth rehearse needs --epsilon: the target of the private run it rehearses")
    overrides = _method_overrides(args) + ([f"run.device={args.device}"] if args.device else [])
    config = resolve_config(args.method, dataset=args.dataset, epsilon=args.epsilon, preset=args.preset,
                            data_dir=args.data_dir, overrides=overrides)
    run = rehearse(config, args.stand_in, args.stand_in_dir, args.shrink, args.classes)
    if run.file(METRICS).exists():
        print(f"a public stand-in's outcome ({args.stand_in}), not the private data's:")
        print(_format_metrics(json.loads(run.file(METRICS).read_text())))


def _format_metrics(metrics: dict[str, Any]) -> str:
    images = metrics["images"]
    counts = f"{images['synthetic']} synthetic vs {images['real']} real ({images['real_split']} split)"
    kid = metrics["kid"]
    lines = [
        f"FID       {metrics['fid']:.2f}   [{counts}]",
        f"FID-inf   {metrics['fid_infinity']:.2f}   [extrapolated to infinitely many images]",
        f"KID       {kid['mean']:.4f} +- {kid['std']:.4f}   [{kid['subsets']} subsets of {kid['subset_size']}]",
        f"precision {metrics['precision']:.3f}   recall {metrics['recall']:.3f}   [k = {metrics['pr_k']}]",
    ]
    for name, result in metrics["accuracy"].items():
        seeds = result.get("seeds", [result])
        epochs = ", ".join(str(run["selected_epoch"]) for run in seeds)
        spread = 100 * result.get("test_accuracy_std", 0.0)
        lines.append(
            f"accuracy  {name:<9}{100 * result['test_accuracy']:.2f} +- {spread:.2f} %"
            f"   [{len(seeds)} seed(s), trained on {result['trained_on']}, epoch {epochs} of {result['epochs']} "
            f"picked by Report Noisy Max on {result['validation_size']} val images, tested on {result['test_size']}]")
    for name, value in metrics.get("method", {}).items():
        lines.append(f"method    {name} = {value:.4f}" if isinstance(value, float) else f"method    {name} = {value}")
    if metrics.get("evaluation_privacy"):
        lines.append(f"model selection spent epsilon = {metrics['evaluation_privacy']['epsilon']:.4f} over every "
                     "evaluation on this validation split so far (evaluation budget, reported apart from synthesis)")
    return "\n".join(lines)


def _evaluate(args: argparse.Namespace) -> None:
    from .pipeline import evaluate_file, evaluate_run
    from .runs import RunDirectory

    path = Path(args.path)
    overrides = parse_overrides(args.set) + ([("run.device", args.device)] if args.device else [])
    if path.is_dir():
        if args.dataset or args.data_dir or args.out:
            raise DpsynthError("a run directory is evaluated on its own dataset, into itself: "
                               "drop --dataset / --data-dir / --out")
        metrics, out = evaluate_run(RunDirectory.open(path), overrides), path
    elif path.is_file():
        direct = [("dataset.name", args.dataset or "fashion-mnist")]
        direct += [("dataset.data_dir", args.data_dir)] if args.data_dir else []
        metrics, out = evaluate_file(path, direct + overrides, args.out)
    else:
        raise DpsynthError(f"{path}: no such run directory or .npz file")
    print(_format_metrics(metrics))
    print(f"metrics and pictures: {out}")


def _export(args: argparse.Namespace) -> None:
    from .export import export_release

    out = export_release(args.release, args.out, args.format)
    print(f"wrote {out} ({args.format}), with the release's privacy.json")


def _sample(args: argparse.Namespace) -> None:
    import torch

    from .api import load_generator
    from .generators import DiffusionGenerator
    from .runs import inside_release, write_synthetic

    if (args.images is None) == (not args.per_class):
        raise DpsynthError("dpsynth sample needs --images N or --per-class CLASS=COUNT (one of them)")
    counts = _per_class(args.per_class) if args.per_class else None
    total = args.images if args.images is not None else sum(counts.values()) if counts else 0
    out = Path(args.out or f"sampled-{total}.npz")
    if out.suffix != ".npz":
        raise DpsynthError(f"--out {out}: the images are written as an .npz file; give a name ending in .npz")
    if inside_release(out) is not None:
        raise DpsynthError(f"--out {out}: that is inside a run's release/ folder, which holds only what its "
                           "privacy.json lists; write the new images elsewhere")
    grid = out.with_suffix(".png")
    for path in (out, grid):
        if path.exists():
            raise DpsynthError(f"--out {out}: {path} exists; give another name (nothing is overwritten)")
    generator = load_generator(args.release, args.device or "auto")
    sampler = {key: value for key, value in (("sampler", args.sampler), ("sample_steps", args.sample_steps),
                                             ("guidance", args.guidance)) if value is not None}
    if sampler:
        if not isinstance(generator, DiffusionGenerator):
            raise DpsynthError(f"--sampler, --sample-steps and --guidance set a diffusion model's sampler; this "
                               f"release holds a {generator.kind} generator")
        generator = generator.with_sampler(**sampler)
    print(generator.describe())
    random = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    start = time.perf_counter()
    samples = generator.sample(args.images, generator=random, per_class=counts,
                               settings=SamplingSettings(batch_size=args.batch_size))
    seconds = time.perf_counter() - start
    write_synthetic(out, samples.images, samples.labels, generator.class_names, grid=grid)
    guarantee = ("drawing from the released model is post-processing: the release's (epsilon, delta) holds for them"
                 if generator.privacy.get("dp_guarantee") else "like the release, they carry no DP guarantee")
    print(f"wrote {len(samples.labels):,} images, drawn in {seconds:.1f} s, to {out} (one row per class: {grid}); "
          f"{guarantee}")


def _per_class(items: list[str]) -> dict[str | int, int]:
    """``CLASS=COUNT`` items (repeated, or joined by commas) as class -> count; DpsynthError for another form."""
    counts: dict[str | int, int] = {}
    for item in ",".join(items).split(","):
        name, sep, number = item.strip().rpartition("=")
        if not sep or not name or not number.strip().isdigit():
            raise DpsynthError(f"--per-class expects CLASS=COUNT (a class name or number, a whole number of images), "
                               f"got {item.strip()!r}")
        counts[name] = counts.get(name, 0) + int(number)
    return counts


def _positive(text: str) -> int:
    """An argument that must be a whole number above 0."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number above 0, got {text!r}")
    return int(text)


def _bench(args: argparse.Namespace) -> None:
    from .bench import BenchSpec, method_list, run_bench

    spec = BenchSpec(method_list(args.methods), args.datasets, args.epsilons, args.preset, args.set, args.data_dir,
                     args.device, args.public_iterations, args.syntheses)
    failed = run_bench(spec, args.out)
    print(f"results: {Path(args.out) / 'results.md'}")
    if failed:
        raise DpsynthError(f"{len(failed)} cell(s) failed: {', '.join(failed)}; their bench.out says why; "
                           "rerun the same command to retry them")


def _doctor(args: argparse.Namespace) -> None:
    from .doctor import doctor

    methods = sorted(METHODS) if args.methods == ["all"] else args.methods
    unknown = [name for name in methods if name not in METHODS]
    if unknown:
        raise DpsynthError(f"unknown method(s) {', '.join(unknown)}; known: all, {', '.join(sorted(METHODS))}")
    failed = [checkup.method for checkup in doctor(args.device, methods, args.keep) if not checkup.passed]
    if failed:
        raise DpsynthError(f"{len(failed)} of {len(methods)} methods failed on this device: {', '.join(failed)}")


def _audit(args: argparse.Namespace) -> None:
    from .audit import AUDITS, BROKEN, run_audit

    names = [name for name in AUDITS if name not in BROKEN] if args.mechanisms == ["all"] else args.mechanisms
    unknown = [name for name in names if name not in AUDITS]
    if unknown:
        raise DpsynthError(f"unknown mechanism(s) {', '.join(unknown)}; known: all, {', '.join(AUDITS)}")
    print(f"{'mechanism':<22} {'claimed eps':>11} {'lower bound (95 %)':>18} {'trials':>8} {'seconds':>8}  "
          f"(delta = {args.delta:g})")
    above = []
    for name in names:
        try:
            result = run_audit(name, AUDITS[name](), args.trials, args.delta, args.seed)
        except DpsynthError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to run is a crash, never a pass or a leak
            raise AuditCrash(f"audit of {name} crashed before it could find or rule out a leak: "
                             f"{type(exc).__name__}: {exc}") from exc
        if result.lower_bound > result.claimed_epsilon:
            above.append(name)
        print(f"{name:<22} {result.claimed_epsilon:>11.3f} {result.lower_bound:>18.3f} {result.trials:>8} "
              f"{result.seconds:>8.1f}{'  LOWER BOUND ABOVE THE CLAIM' if name in above else ''}", flush=True)
    if above:
        raise AuditFailure(f"audit failed: {', '.join(above)} leaked more than its ledger claims (a lower bound on "
                           "epsilon above the claimed epsilon)")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _Version(argparse.Action):
    """``--version``: the version and commit, found only when asked (the commit takes a git call)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version_line())
        parser.exit()


def _add_set(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config key, e.g. --set {example} (repeatable)")


def _add_method_options(parser: argparse.ArgumentParser, epsilon_help: str) -> None:
    parser.add_argument("--dataset", help="dataset name (default: fashion-mnist)")
    parser.add_argument("--data-dir", help="directory (or .npz file) to read the dataset from")
    parser.add_argument("--epsilon", type=float, help=epsilon_help)
    parser.add_argument("--preset", help="auto (the default): batch, steps and release sized to the data, the device "
                                         "and --time-budget by a short probe; cpu or paper: the fixed presets")
    parser.add_argument("--time-budget", metavar="DURATION",
                        help="with --preset auto: wall time of the whole run, training, sampling and evaluation, "
                             "e.g. 45m or 2h (default: 30m; plan.time_budget)")
    parser.add_argument("--time-limit", metavar="DURATION",
                        help="a hard limit, any preset: training stops early (leaving what the plan expects after it) "
                             "and the run releases what it trained, spending less epsilon (run.time_limit)")
    for option, (key, text, metavar) in shortcuts().items():  # the methods' declared ones
        parser.add_argument(option, metavar=metavar, help=f"{text} ({key})")
    parser.add_argument("--release-model", action="store_true",
                        help="release the trained generator beside the images (model.safetensors, model.json), so "
                             "`dpsynth sample` draws more later at no further epsilon (release.model)")
    parser.add_argument("--allow-non-private", action="store_true",
                        help="a configuration that uses the private data without noise (e.g. DP-SAD's "
                             "teacher.training=non-private); its release has NO DP guarantee (run.allow_non_private)")
    _add_set(parser, "privacy.accountant=rdp")


def _shortcut_values(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    """Each option that stands for a config key (``--time-budget``, ``--time-limit`` and the methods' shortcuts): the
    option, the key and the value given (None when not)."""
    options = {"--time-budget": "plan.time_budget", "--time-limit": "run.time_limit",
               **{option: key for option, (key, _, _) in shortcuts().items()}}
    return [(option, key, getattr(args, option[2:].replace("-", "_"))) for option, key in options.items()]


def _method_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` pairs, then the shortcut options as ``key=value`` (they win)."""
    pairs = [(key, value) for _, key, value in _shortcut_values(args)]
    pairs.append(("run.allow_non_private", "true" if args.allow_non_private else None))
    pairs.append(("release.model", "true" if args.release_model else None))
    return args.set + [f"{key}={value}" for key, value in pairs if value]


class _Parser(argparse.ArgumentParser):
    """A sub-command's parser, its help showing defaults (and its own sub-commands' alike)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"formatter_class": _DefaultsShown, **kwargs})


class _DefaultsShown(argparse.HelpFormatter):
    """Help that ends each option with its default, where it has one and the text does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default in (None, False, [], argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list) else default
        return f"{text} (default: {shown})"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="dpsynth", description="Differentially private image synthesis.",
                                     formatter_class=_DefaultsShown)
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print dpsynth's version and the commit it runs from, and exit")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    data = commands.add_parser("data", help="list datasets or describe one").add_subparsers(
        dest="data_command", required=True)
    data.add_parser("list", help="the datasets dpsynth can load").set_defaults(handler=_data_list)
    info = data.add_parser("info", help="shape, classes, split sizes and location of a dataset")
    info.add_argument("name", help="a dataset name (`dpsynth data list` shows them)")
    info.add_argument("--data-dir", help="directory (or .npz file) to read the dataset from")
    _add_set(info, "dataset.resolution=32")
    info.set_defaults(handler=_data_info)

    pretrain = commands.add_parser("pretrain", help="train a diffusion model on PUBLIC data, for PE's diffusion API "
                                                    "or (--for METHOD) as a DP-SGD method's starting point")
    pretrain.add_argument("--dataset", required=True, help="the public dataset to train on")
    pretrain.add_argument("--data-dir", help="directory (or .npz file) to read the dataset from")
    pretrain.add_argument("--out", required=True, help="new directory for the model (diffusers format)")
    pretrain.add_argument("--for", dest="for_method", metavar="METHOD",
                          help="a class-conditional model shaped as METHOD's (its model and diffusion sections), "
                               "to start its runs from (--init-from); default: an unconditional model for PE")
    pretrain.add_argument("--preset", help="with --for: the preset whose model to shape (default the method's)")
    pretrain.add_argument("--upscaler", action="store_true",
                          help="train the release's upscaler instead (release.upscaler): it lifts a release made at a "
                               "smaller dataset.train_resolution to the public images' resolution")
    pretrain.add_argument("--autoencoder", action="store_true",
                          help="train DP-LDM's autoencoder instead (autoencoder.path): its latent space, for images "
                               "of the public images' shape")
    pretrain.add_argument("--iterations", type=int, help=f"Adam steps (default {PretrainSettings.iterations}; "
                                                         "300 with --upscaler, 600 with --autoencoder)")
    pretrain.add_argument("--batch-size", type=int, help=f"images per step (default {PretrainSettings.batch_size}; "
                                                         "16 with --upscaler, 32 with --autoencoder)")
    pretrain.add_argument("--lr", type=float, help=f"Adam's learning rate (default {PretrainSettings.lr:g}; 0.002 "
                                                   "with --upscaler, 0.001 with --autoencoder)")
    pretrain.add_argument("--device", help="auto (CUDA when present), cpu or cuda")
    _add_set(pretrain, "dataset.resolution=32")
    pretrain.set_defaults(handler=_pretrain)

    privacy = commands.add_parser("privacy", help="plan a run's privacy budget (reads only the data's size)")
    privacy.add_argument("method", help=f"one of: {', '.join(sorted(METHODS))}")
    _add_method_options(privacy, "target epsilon of the whole run (default: 10)")
    privacy.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    privacy.set_defaults(handler=_privacy)

    budget = commands.add_parser("budget", help="every release from a data set in the holder's ledger, and the "
                                                "epsilon of all of them together")
    budget.add_argument("data", nargs="?", help="a folder or .npz path, or a dataset name (default: every data set)")
    budget.add_argument("--not-shared", metavar="RUN_DIR",
                        help="mark that run's release never shared: it stays listed and no longer counts")
    budget.add_argument("--shared", metavar="RUN_DIR", help="undo --not-shared: that run's release counts again")
    budget.add_argument("--ledger", metavar="FILE",
                        help="the holder's ledger to read (default $DPSYNTH_RELEASES, else "
                             "~/.local/share/dpsynth/releases.json)")
    budget.set_defaults(handler=_budget)

    officer = commands.add_parser("officer", help="write a released run's officer.html again (the datasheet to sign, "
                                                  "with its evaluation), or print it to PDF")
    officer.add_argument("run_dir", help="a released run directory")
    officer.add_argument("--pdf", metavar="FILE", help="print the page to this PDF with a headless Chromium or Chrome")
    officer.set_defaults(handler=_officer)

    clean = commands.add_parser("clean", help="remove every private cache: decoded images of your folders (partial "
                                              "files of stopped runs included) and features of real images")
    clean.add_argument("--cache-dir", action="append", default=[], metavar="DIR",
                       help="a dataset.cache_dir you set for some runs, besides the default (repeatable)")
    clean.set_defaults(handler=_clean)

    run = commands.add_parser("run", help="train a method on a private dataset and release synthetic images")
    run.add_argument("method", nargs="?", help=f"one of: {', '.join(sorted(METHODS))}")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a crashed or stopped run")
    _add_method_options(run, "target epsilon of the whole release (required: no default)")
    run.add_argument("--device", help="auto (CUDA when present), cpu or cuda")
    run.add_argument("--nproc", type=int, default=1, metavar="N",
                     help="run in N processes on this machine (one per GPU; gloo on the CPU) through torchrun")
    run.set_defaults(handler=_run)

    rehearsal = commands.add_parser("rehearse", help="run a plan on a PUBLIC stand-in of the private data's declared "
                                                     "shape and size, cheaper, at zero epsilon: what it would reach")
    rehearsal.add_argument("method", help=f"one of: {', '.join(sorted(METHODS))}")
    _add_method_options(rehearsal, "target epsilon of the private run rehearsed (required)")
    rehearsal.add_argument("--stand-in", default="glyphs", metavar="DATASET",
                           help="the public dataset to rehearse on (default glyphs: characters in the installed fonts)")
    rehearsal.add_argument("--stand-in-dir", metavar="DIR", help="where to read the stand-in from (a folder, .npz)")
    rehearsal.add_argument("--shrink", type=_positive, default=4, metavar="K",
                           help="each DP-SGD stage at a batch K times smaller, same steps and sigma/B (default 4)")
    rehearsal.add_argument("--classes", type=_positive, metavar="K",
                           help="the stand-in's first K classes (default dataset.num_classes, else all of its own)")
    rehearsal.add_argument("--device", help="auto (CUDA when present), cpu or cuda")
    rehearsal.set_defaults(handler=_rehearse)

    evaluate = commands.add_parser("evaluate", help="FID, KID, precision/recall and downstream accuracy of a release")
    evaluate.add_argument("path", help="a run directory, or a synthetic .npz (arrays images, labels[, soft_labels])")
    evaluate.add_argument("--dataset", help="for an .npz: the dataset it imitates (default fashion-mnist)")
    evaluate.add_argument("--data-dir", help="for an .npz: where to read that dataset from")
    evaluate.add_argument("--out", help="for an .npz: output folder (default <file stem>-evaluation beside it, or in "
                          "the run directory for a file in a run's release/ folder, where nothing else may be "
                          "written)")
    evaluate.add_argument("--device", help="auto (CUDA when present), cpu or cuda")
    _add_set(evaluate, "evaluation.classifier_seeds=1")
    evaluate.set_defaults(handler=_evaluate)

    sample = commands.add_parser("sample", help="draw new images from a released model (a run with --release-model); "
                                                "no private data is read and no epsilon spent")
    sample.add_argument("release", metavar="RELEASE_DIR",
                        help="a release folder holding model.json and model.safetensors (or its run directory)")
    sample.add_argument("--images", type=_positive, metavar="N", help="how many images, the classes in turn")
    sample.add_argument("--per-class", action="append", default=[], metavar="CLASS=COUNT",
                        help="how many images of a class (its name or number; repeatable, or joined by commas), "
                             "instead of --images")
    sample.add_argument("--out", help="the .npz to write, in the release format, with a .png of one row per class "
                                      "beside it (default: sampled-N.npz here; never inside a release folder)")
    sample.add_argument("--device", help="auto (CUDA when present), cpu or cuda")
    sample.add_argument("--batch-size", type=_positive, default=SamplingSettings.batch_size,
                        help="images per sampling call")
    sample.add_argument("--seed", type=int, help="seed of the images' randomness, to draw the same images again "
                                                 "(default: fresh from the OS; either way nothing private depends on "
                                                 "it)")
    sample.add_argument("--sampler", choices=SAMPLER_NAMES, help="a diffusion model's sampler (default: the run's)")
    sample.add_argument("--sample-steps", type=_positive, metavar="N",
                        help="a diffusion model's sampling steps (default: the run's)")
    sample.add_argument("--guidance", type=float, metavar="W",
                        help="a diffusion model's classifier-free guidance weight, 0 for none (default: the run's)")
    sample.set_defaults(handler=_sample)

    export = commands.add_parser("export", help="write a release in a format other tools read without dpsynth: an "
                                                "image folder, or a released diffusion model as a diffusers folder")
    export.add_argument("release", metavar="RELEASE_DIR", help="a run directory that released, or its release/ folder")
    export.add_argument("--format", required=True, choices=("imagefolder", "diffusers"),
                        help="imagefolder: a sub-folder of PNGs per class (torchvision, Hugging Face datasets); "
                             "diffusers: unet/, scheduler/ and sampling.json of a released pixel diffusion model")
    export.add_argument("--out", required=True, metavar="DIR", help="the new folder to write (must not exist, or be "
                                                                    "empty)")
    export.set_defaults(handler=_export)

    bench = commands.add_parser("bench", help="run methods x datasets x epsilons alike and tabulate the results")
    bench.add_argument("--methods", nargs="+", required=True, help=f"all, or some of: {', '.join(sorted(METHODS))}")
    bench.add_argument("--datasets", nargs="+", default=["fashion-mnist"], help="dataset names")
    bench.add_argument("--epsilons", nargs="+", type=float, required=True, help="target epsilons")
    bench.add_argument("--preset", default="cpu", help="configuration preset of every run: cpu or paper (fixed, so "
                                                       "cells compare alike) or auto (sized to this machine)")
    bench.add_argument("--out", default="bench", help="bench directory; rerun with the same options to resume")
    bench.add_argument("--data-dir", help="directory (or .npz file) of the one dataset")
    bench.add_argument("--device", help="auto (CUDA when present), cpu or cuda")
    bench.add_argument("--public-iterations", type=int, default=2000,
                       help="Adam steps of the public (glyph) model the bench pre-trains for a method that needs one "
                            "and is given none (pdp-diffusion)")
    bench.add_argument("--syntheses", type=int, default=1,
                       help="independent syntheses of each cell (runs/<cell>-s2, ...), their spread tabulated")
    bench.add_argument("--set", action="append", default=[], metavar="[METHOD:]KEY=VALUE",
                       help="override a config key in every run, or in one method's runs (repeatable)")
    bench.set_defaults(handler=_bench)

    doctor = commands.add_parser("doctor", help="each method a few steps on a tiny configuration on this device, "
                                                  "interrupted and resumed, then its ledger and release checked")
    doctor.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda[:N]")
    doctor.add_argument("--methods", nargs="+", default=["all"], help=f"all, or some of: {', '.join(sorted(METHODS))}")
    doctor.add_argument("--keep", metavar="DIR", help="keep the run directories under DIR (default: removed)")
    doctor.set_defaults(handler=_doctor)

    audit = commands.add_parser("audit", help="empirical lower bounds on epsilon of each mechanism (canary tests); "
                                "exits 1 when a bound exceeds its mechanism's claim, 3 when an audit "
                                "crashes")
    audit.add_argument("mechanisms", nargs="+", metavar="MECHANISM",
                       help="all (every mechanism the methods run), or names from the table it prints; "
                            "broken-gaussian-sum and broken-group-step are wrong on purpose and must fail")
    audit.add_argument("--trials", type=int, default=20_000, help="runs with and without the canary, each")
    audit.add_argument("--delta", type=float, default=1e-5, help="the delta at which each lower bound on epsilon "
                                                                  "is computed")
    audit.add_argument("--seed", type=int, default=0, help="seed of the audit's trials (an audit is public: it "
                                                           "runs the mechanisms on canaries, not on private data)")
    audit.set_defaults(handler=_audit)
    return parser


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    print(f"dpsynth: warning: {message}", file=sys.stderr)


def _how_to_continue(command: str, run_directory: Path | None) -> str:
    """What continues interrupted work: a bench's rerun, the run directory's resume or evaluation."""
    from .runs import PRIVACY

    if command == "bench":
        return "the bench continues from where it stopped when rerun with the same options"
    if run_directory is None:
        return "nothing was left to resume"
    if (run_directory / PRIVACY).exists():
        return f"the release is written; `dpsynth evaluate {run_directory}` evaluates it"
    return f"the run continues from its last checkpoint with `dpsynth run --resume {run_directory}`"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; user errors print one line and exit with status 2 (a failed audit: 1)."""
    try:
        args = build_parser().parse_args(argv)
    except DpsynthError as exc:  # a method's package that declares none, say
        print(f"dpsynth: error: {exc}", file=sys.stderr)
        return 2
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    handler: Callable[[argparse.Namespace], None] = args.handler
    warnings.showwarning = _show_warning
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # a scheduler's stop ends it as Ctrl-C does
    try:
        with printed_to(sys.stdout, warnings_to=sys.stderr):  # what the library tells, for the command's user
            handler(args)
    except DpsynthError as exc:
        print(f"dpsynth: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt as interrupt:
        where = getattr(interrupt, "run_directory", None)
        print(f"dpsynth: interrupted; {_how_to_continue(args.command, where)}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
