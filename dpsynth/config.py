"""Run configuration: shared defaults, a method's sections and presets, then ``--set key=value`` overrides."""
from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType, UnionType
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from .errors import ConfigError

Config = dict[str, Any]

ACCOUNTANTS = ("pld", "rdp")  # the privacy accountants (dpsynth.privacy.accountant) a config may name
SCHEMA = 7  # the version of config.yaml this dpsynth writes (key ``schema``): raised with each MIGRATIONS step


S = TypeVar("S")


def positive(**kwargs: Any) -> Any:
    """A settings field (:func:`section_settings`) that must be a positive number."""
    return field(metadata={"low": 0, "strict": True}, **kwargs)


def at_least(low: float, **kwargs: Any) -> Any:
    """A settings field (:func:`section_settings`) that must be a number of at least ``low``."""
    return field(metadata={"low": low}, **kwargs)


def one_of(*choices: str, **kwargs: Any) -> Any:
    """A settings field (:func:`section_settings`) that must be one of ``choices``."""
    return field(metadata={"choices": choices}, **kwargs)


def not_a_key(default: Any) -> Any:
    """A settings field that is no config key (a section's own name, say): no config sets it."""
    return field(default=default, metadata={"not_a_key": True})


class Section:
    """A shared config section as a frozen dataclass: its fields are the section's keys, with their one default,
    type and rule; :meth:`of` reads the section of a config, checked."""

    section: ClassVar[str]

    @classmethod
    def of(cls: type[S], config: Mapping[str, Any]) -> S:
        return section_settings(cls, config, cls.section)  # type: ignore[attr-defined]


Auto = Literal["auto"]


@dataclass(frozen=True, kw_only=True)
class DatasetSettings(Section):
    """The ``dataset`` section: which data set, where, its held-out sizes (None: the set's own) and the seed of
    their split; a folder's resolution and channels (auto: a DP vote of its images decides; generated sets, glyphs
    and photo-patches, are 32 x 32 RGB), its classes and how many images to read; how a folder's 16-bit and DICOM
    values map to 8 bits (``window``: [low, high] in their units; auto: voted with the shape when the shape is
    voted, else the full range; full: the full range of their type; dicom: each DICOM file's own window), where its
    decoded images are kept (private: they are the images; null keeps none), the title, description and owner the
    holder gives the release and what the data calls one person (``unit_name``: patient, say);
    ``train_resolution``: the side training reads the images at (a smaller one: shrunk by area averaging, the release
    lifted back by ``release.upscaler``; auto: the derived plan's choice, else the data's side)."""

    section: ClassVar[str] = "dataset"
    name: str = "fashion-mnist"
    data_dir: str | None = None
    val_size: int | float | None = None  # a count, or a share of the whole set
    test_size: int | float | None = None
    split_seed: int = 0
    resolution: int | Auto = positive(default="auto")
    channels: int | Auto = positive(default="auto")
    train_resolution: int | Auto = positive(default="auto")  # auto: the plan's choice (preset auto), else the data's
    num_classes: int | None = positive(default=None)
    num_images: int | None = positive(default=None)
    window: Literal["auto", "full", "dicom"] | tuple[float, ...] = "auto"
    cache_dir: str | None = "~/.cache/dpsynth/folders"
    title: str | None = None  # free text the holder writes: heads the release's datasheet
    description: str | None = None
    owner: str | None = None  # who holds the data and answers for the release (the datasheet's first line)
    unit_name: str | None = None  # what one person of the data is called (patient, say); None: person or image

    def __post_init__(self) -> None:
        if isinstance(self.window, tuple) and not (len(self.window) == 2 and self.window[0] < self.window[1]):
            raise ConfigError(f"dataset.window must be auto, full, dicom or [low, high] with low below high (in the "
                              f"images' values: raw 16-bit values, Hounsfield units), got {list(self.window)}")


@dataclass(frozen=True, kw_only=True)
class PrivacySettings(Section):
    """The ``privacy`` section: the target epsilon and delta (None: from the training set's size), the accountant,
    the training set's size (auto: published, declared or a noisy count; noisy: a noisy count), and with groups
    (one person's images) the most of a group's images a DP-SGD step reads (the group's mean gradient is clipped,
    so the bound holds for any number; this caps the work). ``epsilon_reason``: why this ε (free text, on the
    datasheet); ``total_epsilon``: the holder's cap on the ε of every release from the same data together, which
    refuses a run before it starts; ``holder_ledger``: the file that lists those releases
    (:mod:`dpsynth.privacy.releases`). What a run's mechanisms draw is kept beside the sections (:class:`Drawn`)."""

    section: ClassVar[str] = "privacy"
    epsilon: float = 10.0  # positive or inf: the accountant checks it (dpsynth.privacy.accountant.check_epsilon)
    delta: float | None = None
    accountant: str = one_of(*ACCOUNTANTS, default="pld")
    dataset_size: int | Literal["auto", "noisy"] = positive(default="auto")
    max_images_per_group: int = positive(default=16)
    epsilon_reason: str | None = None  # free text: why this epsilon, as the holder's officer agreed it
    total_epsilon: float | None = positive(default=None)  # the holder's cap on all releases from this data together
    holder_ledger: str | None = None  # None: $DPSYNTH_RELEASES, else ~/.local/share/dpsynth/releases.json


@dataclass(frozen=True, kw_only=True)
class PlanSettings(Section):
    """The ``plan`` section of ``--preset auto``: the time budget of the whole run and what the user set (kept);
    ``force``: run a plan whose DP-SGD the recorded outcomes say will not learn (:mod:`dpsynth.autoplan.regime`)
    instead of refusing it, any preset. What the plan found is kept beside the sections (:class:`DerivedPlan`)."""

    section: ClassVar[str] = "plan"
    time_budget: str = "30m"
    user_keys: tuple[str, ...] = ()
    force: bool = False


@dataclass(frozen=True, kw_only=True)
class DerivedPlan(Section):
    """What a derived plan (``--preset auto``, :mod:`dpsynth.autoplan`) found, a record of the run's beside the
    user's sections (``derived`` in its config.yaml): the base preset, the probe's measurements, the decisions in
    words and the expected seconds of each phase. Its values are applied in the sections themselves."""

    section: ClassVar[str] = "derived"
    base: str | None = None
    probe: dict | None = None
    decisions: tuple[str, ...] | None = None
    expected_seconds: dict | None = None


@dataclass(frozen=True, kw_only=True)
class Drawn(Section):
    """What a run's DP mechanisms drew from the private data before its method ran, each recorded in its ledger
    (:mod:`dpsynth.privacy.dataset_facts`): the training set's noisy size, the shape ([channels, side]) and the 16-bit
    window (shares of the full range) a DP vote of a folder's images decided, and the noisy mean of a person's
    images (capped) a derived plan prices a step by. A record of the run's, kept in its config.yaml beside the
    user's sections (``drawn``), never one of them: only a run writes it (:data:`RUN_WRITTEN`)."""

    section: ClassVar[str] = "drawn"
    dataset_size: int | None = None
    shape: tuple[int, ...] | None = None
    window: tuple[float, ...] | None = None
    images_per_group: float | None = None


@dataclass(frozen=True, kw_only=True)
class RunSettings(Section):
    """The ``run`` section: where runs go, a seed (set: the noise is recomputable, the release NOT private), the
    device, the thread count, whether a stage may use the private data without noise, and ``time_limit``: a
    duration after which training stops and the run releases what it trained (spending less ε)."""

    section: ClassVar[str] = "run"
    out_dir: str = "runs"
    seed: int | None = None
    device: str = "auto"
    threads: int | Auto = "auto"  # auto or a positive number: dpsynth.hardware.check_threads says which
    allow_non_private: bool = False
    time_limit: str | None = None  # a duration (45m, 2h) from the command's start; None: train as planned


@dataclass(frozen=True, kw_only=True)
class SamplingSettings(Section):
    """The ``sampling`` section: how many images the release holds, in chunks of ``batch_size``, with bf16 and a
    compiled model where the hardware gains from them (auto)."""

    section: ClassVar[str] = "sampling"
    num_samples: int = positive(default=60000)
    batch_size: int = positive(default=500)
    bf16: bool | str = "auto"  # auto, true or false: dpsynth.hardware resolves and checks both
    compile: bool | str = "auto"


@dataclass(frozen=True, kw_only=True)
class ReleaseSettings(Section):
    """The ``release`` section: what the release holds beside the synthetic images; ``model``: the trained generator
    they were sampled from (``model.safetensors`` and ``model.json``), for the methods that train one;
    ``upscaler``: the model trained on public images only that lifts a release made at ``dataset.train_resolution``
    to the data's side (``default``: built from images that installed packages ship; else a folder written by
    ``dpsynth pretrain --upscaler``); ``purpose``: what the release is for and who receives it (free text, on the
    datasheet)."""

    section: ClassVar[str] = "release"
    model: bool = False
    upscaler: str = "default"
    purpose: str | None = None  # free text: what the release is for and who receives it (on the datasheet)


@dataclass(frozen=True, kw_only=True)
class EvaluationSection(Section):
    """The ``evaluation`` section: whether a run evaluates its release and how (a ``protocol`` other than
    ``dpsynth`` fixes the keys it names); Inception metrics on ``num_synthetic`` and ``num_real`` images, downstream
    classifiers trained on the release and selected privately at ``selection_epsilon``. The rules that need the
    evaluation's own tables (protocols, classifier names, schedules) are checked by
    :class:`dpsynth.evaluation.EvaluationSettings`."""

    section: ClassVar[str] = "evaluation"
    enabled: bool = True
    protocol: str = "dpsynth"
    num_synthetic: int = positive(default=2000)
    num_real: int = positive(default=2000)
    real_split: str = one_of("train", "val", "test", default="train")
    fast_inception: bool | str = "auto"  # auto, true or false: dpsynth.hardware resolves and checks it
    inception_batch_size: int = positive(default=50)
    kid_subsets: int = positive(default=100)
    kid_subset_size: int = positive(default=1000)
    pr_k: int = positive(default=4)
    classifiers: tuple[str, ...] = ("cnn", "resnet")
    classifier_epochs: int = positive(default=10)
    soft_label_epochs: int | None = positive(default=None)  # None: classifier_epochs
    distillation_temperature: float | None = positive(default=None)  # None: the release's soft-label temperature
    classifier_seeds: int = positive(default=3)
    classifier_batch_size: int = positive(default=128)
    classifier_lr: float = 3e-3
    classifier_schedule: str = "cosine"
    classifier_ema: float = at_least(0, default=0.0)
    classifier_augment: bool = False
    selection_epsilon: float = 1.0
    nearest_neighbours: int = 10
    cache_dir: str | None = None
    seed: int = 0


def section_defaults(kind: type) -> Config:
    """The defaults of settings dataclass ``kind`` as a config section (lists for tuples, as YAML writes them)."""
    return {spec.name: list(spec.default) if isinstance(spec.default, tuple) else spec.default
            for spec in fields(kind) if not spec.metadata.get("not_a_key")}


SHARED_SECTIONS: tuple[type[Section], ...] = (DatasetSettings, PrivacySettings, PlanSettings, RunSettings,
                                              SamplingSettings, ReleaseSettings, EvaluationSection)
SHARED_BY_NAME: dict[str, type[Section]] = {kind.section: kind for kind in SHARED_SECTIONS}
BASE_CONFIG: Config = {name: section_defaults(kind) for name, kind in SHARED_BY_NAME.items()}
RECORDS: dict[str, type[Section]] = {Drawn.section: Drawn, DerivedPlan.section: DerivedPlan}  # what a run writes


# Keys only a run writes: what its DP mechanisms drew, recorded in its ledger. A value set by hand would be published
# under a DP label without the noise behind it, so --set, presets and a fresh run refuse them.
RUN_WRITTEN = {
    "drawn.dataset_size": "the noisy count of the training set's size; to publish the size without noise, declare "
                          "it: privacy.dataset_size=N",
    "drawn.window": "the 16-bit window a DP vote of a folder's images decided; to choose it without noise, declare "
                    "it: dataset.window=[low, high]",
    "drawn.shape": "the shape a DP vote of a folder's images decided; to choose it without noise, declare it: "
                   "dataset.resolution=R and dataset.channels=C",
    "drawn.images_per_group": "the noisy mean of images a derived plan read per person; to price a step without "
                              "noise, declare the most a person has: privacy.max_images_per_group=K",
}


def with_drawn(config: RunConfig, **values: Any) -> RunConfig:
    """A copy of ``config`` whose :class:`Drawn` record holds ``values`` too (``shape=[3, 64]``): the one way a drawn
    value enters a run's configuration."""
    assert all(f"drawn.{name}" in RUN_WRITTEN for name in values), values  # a programming error, not the user's
    return with_record(config, Drawn, **values)


def with_record(config: RunConfig, kind: type[Drawn] | type[DerivedPlan], **values: Any) -> RunConfig:
    """A copy of ``config`` whose record ``kind`` (what the run drew, what its plan found) holds ``values`` too."""
    record = config.to_dict()
    record[kind.section] = {**record.get(kind.section, {}), **values}
    return RunConfig(record, config.kinds)


def with_decisions(config: RunConfig, decisions: Sequence[str]) -> RunConfig:
    """A copy of ``config`` with ``decisions`` (in words) added to its derived plan's (``derived.decisions``)."""
    return with_record(config, DerivedPlan, decisions=[*(config.derived.decisions or ()), *decisions])


def check_not_run_written(keys: Iterable[str], source: str) -> None:
    """ConfigError naming ``source`` when ``keys`` hold a key only a run writes (:data:`RUN_WRITTEN`)."""
    for key in keys:
        if key in RUN_WRITTEN:
            raise ConfigError(f"{source} {key}: only a run writes this key ({RUN_WRITTEN[key]})")


# What a config holds beside its sections: what it is (its schema, method and preset) and the machine a run ran on.
NOT_SECTIONS = ("schema", "method", "preset", "hardware")


def check_known_keys(config: Mapping[str, Any], kinds: Mapping[str, type], source: str) -> None:
    """ConfigError naming ``source`` (where given) and the first key of ``config`` that neither a section's settings
    class (``kinds``) nor a run's records (:class:`Drawn`, :class:`DerivedPlan`) has, with the closest known keys: a
    key set by hand that nothing reads is refused, not ignored."""
    known = {name: section_defaults(kind) for name, kind in {**kinds, **RECORDS}.items()}
    for section, values in config.items():
        if section in NOT_SECTIONS:
            continue
        if section not in known:
            raise _unknown_key(section, known, source)
        for key in values if isinstance(values, Mapping) else ():
            if key not in known[section]:
                raise _unknown_key(f"{section}.{key}", known, source)


def schema_of(config: Mapping[str, Any]) -> Any:
    """The ``schema`` a config says it was written in (None where it says none)."""
    return config.get("schema")


def method_name(config: Mapping[str, Any]) -> str:
    """The method ``config`` runs (its ``method`` key); ConfigError where it names none."""
    return _named(config, "method")


def preset_name(config: Mapping[str, Any]) -> str:
    """The preset ``config`` was built from (its ``preset`` key); ConfigError where it names none."""
    return _named(config, "preset")


def _named(config: Mapping[str, Any], key: str) -> str:
    value = config.get(key)
    if not isinstance(value, str):
        raise ConfigError(f"{key} must name a {key}, got {value!r}")
    return value


def flat_keys(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of every leaf, e.g. ``privacy.epsilon``."""
    keys = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        keys += flat_keys(value, f"{name}.") if isinstance(value, Mapping) else [name]
    return keys


def _unknown_key(key: str, config: Mapping[str, Any], source: str) -> ConfigError:
    known = flat_keys(config) if "." in key else list(config)
    close = difflib.get_close_matches(key, known, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else f"known keys: {', '.join(known)}"
    where = f"{source}: " if source else ""
    return ConfigError(f"{where}unknown config key {key!r}; {hint}")


def get_value(config: Mapping[str, Any], key: str) -> Any:
    """The value at dotted ``key`` (KeyError or TypeError where the path does not exist)."""
    node: Any = config
    for part in key.split("."):
        node = node[part]
    return node


def has_key(config: Mapping[str, Any], key: str) -> bool:
    """Whether ``config`` holds dotted ``key`` (its value a leaf or a mapping, such as a derived plan's probe)."""
    try:
        get_value(config, key)
    except (KeyError, TypeError):
        return False
    return True


def set_value(config: Config, key: str, value: Any, source: str = "--set",
              kinds: Mapping[str, type] | None = None) -> None:
    """Set dotted ``key`` to ``value``; ConfigError naming ``source`` unless the key exists and, where ``kinds``
    (each section's settings class) are given, the value is one its field takes (:func:`typed_value`)."""
    *parents, leaf = key.split(".")
    node: Any = config
    for part in parents:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            raise _unknown_key(key, config, source)
        node = node[part]
    if leaf not in node or isinstance(node[leaf], dict):
        raise _unknown_key(key, config, source)
    node[leaf] = value if kinds is None else typed_value(kinds, key, value, source)


def typed_value(kinds: Mapping[str, type], key: str, value: Any, source: str) -> Any:
    """``value`` of dotted ``key`` as its section's settings class (``kinds[section]``) reads it, checked by the one
    rule every read applies (:func:`section_settings`), as YAML writes it (lists for tuples); ConfigError naming
    ``source`` and the key otherwise."""
    section, leaf = key.split(".", 1)
    spec = next(spec for spec in fields(kinds[section]) if spec.name == leaf)  # type: ignore[arg-type]
    try:
        checked = _checked(key, value, get_type_hints(kinds[section])[leaf], spec.metadata)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return _as_yaml(checked)


def _as_yaml(value: Any) -> Any:
    return [_as_yaml(item) for item in value] if isinstance(value, tuple) else value


def merge(config: Config, update: Mapping[str, Any], source: str, kinds: Mapping[str, type] | None = None) -> None:
    """Apply a nested ``update`` (a preset) whose keys must all exist in ``config`` (their values checked against
    ``kinds`` where given: :func:`set_value`)."""
    for key in flat_keys(update):
        set_value(config, key, get_value(update, key), source, kinds)


def parse_overrides(items: Iterable[str]) -> list[tuple[str, Any]]:
    """``key=value`` strings to (key, value), values read as YAML scalars (``1e-3``, ``true``, ``null``)."""
    pairs = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: cannot read the value ({exc})") from None
        pairs.append((key.strip(), _number_or_self(value)))
    return pairs


def _number_or_self(value: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` as a string; read it as the number it is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def build_config(
    method_sections: Mapping[str, type],
    preset: Mapping[str, Any],
    preset_name: str,
    overrides: Iterable[tuple[str, Any]] = (),
) -> Config:
    """Base config plus the method's sections (name -> settings class) at their defaults, then its preset, then
    the overrides, in that order; each value set is checked by its field's type and rule."""
    config = copy.deepcopy(BASE_CONFIG)
    for section, kind in method_sections.items():
        if section in config:
            raise ConfigError(f"method section {section!r} clashes with a shared section")
        config[section] = section_defaults(kind)
    kinds = {**SHARED_BY_NAME, **method_sections}
    check_not_run_written(flat_keys(preset), f"preset {preset_name!r}:")
    merge(config, preset, f"preset {preset_name!r}", kinds)
    for key, value in overrides:
        check_not_run_written([key], "--set")
        set_value(config, key, value, "--set", kinds)
    return config


def dump_config(config: Mapping[str, Any]) -> str:
    """The config (a dict or a :class:`RunConfig`) as YAML, keys in their defined order."""
    return yaml.safe_dump(config.to_dict() if isinstance(config, RunConfig) else config, sort_keys=False)


def load_config(text: str, source: str) -> Config:
    """Read a YAML config written by :func:`dump_config`, migrated to this dpsynth's :data:`SCHEMA`."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a mapping of config sections")
    return migrate(config, source)


@dataclass(frozen=True)
class Migration:
    """What configs older than ``schema`` meant by keys they lack whose default would change how they ran: each
    key (``section.key``) with the value that keeps it, set in the sections such a config has; and the keys that
    moved, each to its new ``section.key`` (a value of None is dropped: the new place's default)."""

    schema: int
    old_values: Mapping[str, Any] = field(default_factory=dict)
    moved: Mapping[str, str] = field(default_factory=dict)  # an old key -> where its value is kept now


# The steps from older configs, in order. A key added with a default that keeps older runs' behaviour needs no step
# (every key a config lacks takes its default) and no new SCHEMA; a key whose default would change them needs one.
MIGRATIONS = (
    # schema 0 (no ``schema`` key): class rows started at the null row, DDIM sampled throughout
    Migration(1, {"model.init_from": None, "model.class_start": "shared", "diffusion.sampler": "ddim",
                  "diffusion.guidance_interval": [0.0, 1.0]}),
    # schema 5 and older: what the run drew was kept in its privacy section
    Migration(6, moved={"privacy.noisy_dataset_size": "drawn.dataset_size", "privacy.noisy_shape": "drawn.shape",
                        "privacy.noisy_window": "drawn.window",
                        "privacy.noisy_images_per_group": "drawn.images_per_group"}),
    # schema 6 and older: what a derived plan found was kept in the plan section
    Migration(7, moved={"plan.base": "derived.base", "plan.probe": "derived.probe",
                        "plan.decisions": "derived.decisions", "plan.expected_seconds": "derived.expected_seconds"}),
)


IDENTITY = ("method", "preset", "dataset.name", "privacy.epsilon")  # what a run is: never filled in by a default


def migrate(config: Config, source: str) -> Config:
    """``config`` as :data:`SCHEMA`: the :data:`MIGRATIONS` steps newer than its schema (all for a file without
    ``schema``), then every shared key it lacks with its default (the method's keys take theirs where the method is
    known: :func:`dpsynth.api.stored_config`); ConfigError naming ``source`` and the fix for a schema this dpsynth
    does not know, or the :data:`IDENTITY` keys it lacks."""
    version = config.get("schema", 0)
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= SCHEMA:
        raise ConfigError(f"{source}: schema {version!r}, but this dpsynth reads schema {SCHEMA} and older; "
                          "read it with the dpsynth that wrote it, or upgrade dpsynth")
    missing = [key for key in IDENTITY if not has_key(config, key)]
    if missing:
        raise ConfigError(f"{source}: missing {', '.join(missing)}: not a config dpsynth wrote (every one names "
                          "these, and no default stands in for them)")
    migrated: Config = {"schema": SCHEMA, **{key: copy.deepcopy(value) for key, value in config.items()
                                             if key != "schema"}}
    for step in MIGRATIONS:
        for key, value in step.old_values.items() if version < step.schema else ():
            section, leaf = key.split(".")
            if isinstance(migrated.get(section), dict):
                migrated[section].setdefault(leaf, copy.deepcopy(value))
        migrated = moved_keys(migrated, step.moved) if version < step.schema else migrated
    return with_defaults(migrated, BASE_CONFIG)


def moved_keys(config: Config, moved: Mapping[str, str]) -> Config:
    """``config`` with each key of ``moved`` it holds at its new place (dropped where its value is None)."""
    for old, new in moved.items():
        section, leaf = old.split(".")
        if not isinstance(config.get(section), dict) or leaf not in config[section]:
            continue
        value = config[section].pop(leaf)
        if value is not None:
            place, name = new.split(".")
            config.setdefault(place, {})[name] = value
    return config


def migrated_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's fixed settings (dotted keys) as this dpsynth names them: each moved key at its new place,
    dropped where its value is None."""
    renamed = {old: new for step in MIGRATIONS for old, new in step.moved.items()}

    def place(key: str) -> str:  # a moved key, or a key inside a moved mapping (plan.probe.device)
        old = next((old for old in renamed if key == old or key.startswith(f"{old}.")), None)
        return key if old is None else renamed[old] + key[len(old):]
    return {place(key): value for key, value in settings.items() if key not in renamed or value is not None}


def with_defaults(config: Config, defaults: Config) -> Config:
    """``config`` with every key of ``defaults`` it lacks (a copy of the default), in place; returns it."""
    for key in flat_keys(defaults):
        section, leaf = key.split(".")
        values = config.setdefault(section, {})
        if isinstance(values, dict):  # one that is not stays for the validation to name
            values.setdefault(leaf, copy.deepcopy(get_value(defaults, key)))
    return config


class RunConfig(Mapping[str, Any]):
    """A run's configuration, read-only and parsed once: each section read through its settings class the first time
    it is asked for and kept (:func:`section_settings` of a RunConfig asks it); :meth:`replaced` gives the changed
    copy a plan tries. ``kinds``: each section's settings class (the shared ones' and the method's). A mapping of
    its sections, so a function that reads a config dict reads it too; :meth:`to_dict` gives the dict YAML writes."""

    def __init__(self, values: Mapping[str, Any], kinds: Mapping[str, type]) -> None:
        self._values: Config = copy.deepcopy(dict(values))
        self._kinds = dict(kinds)
        self._read: dict[tuple[type, str], Any] = {}

    @classmethod
    def shared(cls, config: Mapping[str, Any]) -> RunConfig:
        """``config`` (itself when it is a RunConfig) with the shared sections' classes only: for what reads no
        method's section (a config without a method, such as the evaluation of a file's)."""
        return config if isinstance(config, RunConfig) else cls(config, SHARED_BY_NAME)

    def __getitem__(self, key: str) -> Any:
        value = self._values[key]
        return MappingProxyType(value) if isinstance(value, dict) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def kinds(self) -> dict[str, type]:
        """Each section's settings class."""
        return dict(self._kinds)

    @property
    def drawn(self) -> Drawn:
        """What the run's DP mechanisms drew (:class:`Drawn`; nothing before they ran)."""
        return self.read(Drawn, Drawn.section)

    @property
    def derived(self) -> DerivedPlan:
        """What its derived plan found (:class:`DerivedPlan`; nothing for a fixed preset or before the plan)."""
        return self.read(DerivedPlan, DerivedPlan.section)

    def section(self, name: str) -> Any:
        """Section ``name`` as its settings class reads it."""
        return self.read(self._kinds[name], name)

    def read(self, kind: type[S], section: str) -> S:
        """Section ``section`` as ``kind`` reads it (checked once, then kept)."""
        if (kind, section) not in self._read:
            self._read[kind, section] = _parsed(kind, self._values, section)
        return self._read[kind, section]

    def replaced(self, update: Mapping[str, Any], source: str) -> RunConfig:
        """A copy with the nested ``update`` applied (:func:`merge`: every key must exist)."""
        values = self.to_dict()
        merge(values, update, source)
        return RunConfig(values, self._kinds)

    def to_dict(self) -> Config:
        """The configuration as a plain dict (a copy), as :func:`dump_config` writes it."""
        return copy.deepcopy(self._values)


def section_settings(kind: type[S], config: Mapping[str, Any], section: str) -> S:
    """Config section ``section`` as the frozen dataclass ``kind``, whose fields name the keys it reads.

    Every value is checked against its field's type (``int``: a whole number; ``float``: any number; ``bool``;
    ``str``; ``Literal[...]``: one of those words; ``dict``: a mapping; unions such as ``float | None``;
    ``tuple[X, ...]``: a list of X) and its :func:`positive`,
    :func:`at_least` or :func:`one_of` rule; a key the section lacks takes the field's default; a ``section``
    field that is no key (:func:`not_a_key`) takes the section's name. ConfigError naming ``section.key`` and what
    it must be otherwise. A :class:`RunConfig` reads each section once.
    """
    return config.read(kind, section) if isinstance(config, RunConfig) else _parsed(kind, config, section)


def _parsed(kind: type[S], config: Mapping[str, Any], section: str) -> S:
    values, hints = config.get(section) or {}, get_type_hints(kind)
    settings = {}
    for spec in fields(kind):  # type: ignore[arg-type]
        key = f"{section}.{spec.name}"
        if spec.name == "section" and spec.metadata.get("not_a_key"):
            settings["section"] = section
        elif spec.name in values:
            settings[spec.name] = _checked(key, values[spec.name], hints[spec.name], spec.metadata)
        elif spec.default is MISSING and spec.default_factory is MISSING:
            raise ConfigError(f"{key} is missing from the config")
    return kind(**settings)


_KINDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


def _checked(key: str, value: Any, kind: Any, rules: Mapping[str, Any]) -> Any:
    """``value`` as type ``kind`` (lists become tuples, whole numbers floats where a float is expected);
    ConfigError naming ``key`` when it is not one or breaks ``rules``."""
    kinds = [arg for arg in get_args(kind) if arg is not type(None)] if get_origin(kind) in (Union, UnionType) \
        else [kind]
    if value is None and len(kinds) < len(get_args(kind)):
        return None
    for option in kinds:
        if get_origin(option) is Literal and isinstance(value, str) and value in get_args(option) \
                or option is dict and isinstance(value, dict):
            return value
        if get_origin(option) is tuple and isinstance(value, (list, tuple)):
            return tuple(_checked(f"{key}[{i}]", item, get_args(option)[0], rules) for i, item in enumerate(value))
        if option is bool and isinstance(value, bool) or option is str and isinstance(value, str):
            return _within(key, value, rules)
        if option in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and (option is float or isinstance(value, int)):
            return _within(key, option(value), rules, _KINDS[option])
    expected = " or ".join(_described(option) for option in kinds)
    raise ConfigError(f"{key} must be {expected}{' or null' if len(kinds) < len(get_args(kind)) else ''}, "
                      f"got {value!r}")


def _described(kind: Any) -> str:
    """What a value of type ``kind`` is, in words, for a message."""
    if get_origin(kind) is Literal:
        return " or ".join(map(str, get_args(kind)))
    return "a list" if get_origin(kind) is tuple else "a mapping" if kind is dict else _KINDS[kind]


def _within(key: str, value: Any, rules: Mapping[str, Any], kind: str = "") -> Any:
    """``value``; ConfigError naming ``key`` when it lies below the rule's bound or outside its choices."""
    if "choices" in rules and value not in rules["choices"]:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, rules['choices']))}, got {value!r}")
    low = rules.get("low")
    if low is not None and (value <= low if rules.get("strict") else value < low):
        bound = f"above {low}" if rules.get("strict") else f"of at least {low}"
        raise ConfigError(f"{key} must be {kind} {bound}, got {value!r}")
    return value


def preset_with(base: Mapping[str, Mapping[str, Any]], extra: Mapping[str, Mapping[str, Any]]) -> Config:
    """A preset built on ``base``: a copy with each section of ``extra`` updated into it."""
    merged = {section: dict(copy.deepcopy(values)) for section, values in base.items()}
    for section, values in extra.items():
        merged.setdefault(section, {}).update(copy.deepcopy(values))
    return merged
