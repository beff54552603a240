"""Measured recipes for the shapes holders keep (64 px and up): which method, at which training side and budget,
gave what on data of a given size and epsilon, and the method ``dpsynth privacy`` recommends from them.

The package ships the committed measurements (``recipes.json``, written by ``benchmarks/regime_records.py`` from
``benchmarks/results``): each evaluated run of a derived plan on data of 64 px or more, with its N, data side,
training side, epsilon, time budget, machine and date, and what came out: the CNN's test accuracy (beside its
chance level and, where measured, the same CNN trained on the real training images), and FID-infinity.

A recommendation reads only public or noisy facts (N as planning uses it, the data's side and channels, epsilon,
the budget) and picks, among the recipes at the data's side and channels, those measured nearest to its N and
epsilon within the budget; of those, the one whose release went furthest from chance. It says when none learned
anything, and what to try.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from typing import Any

RECIPES_FILE = "recipes.json"
HOLDER_SIDE = 64  # the recipes cover data of this side and more
BUDGET_SLACK = 1.1  # a recipe measured at up to this multiple of the user's budget still fits it
NOTHING_SHARE = 0.1  # of the way from chance to 100 %: at or below it a release learned nothing
CELL = 0.5  # recipes within this log-distance of the nearest one are compared as one cell (N within 1.65x)


@dataclass(frozen=True)
class Recipe:
    """One measured run of a derived plan on holder-sized images, and what it released."""

    record: str
    method: str
    data: str
    units: int
    side: int
    train_side: int
    channels: int
    epsilon: float
    budget_minutes: float
    wall_minutes: float
    accuracy: float
    chance: float
    real_accuracy: float | None
    fid_infinity: float | None
    machine: str
    date: str

    @property
    def gain(self) -> float:
        """The share of the way from chance to 100 % (or to the real-image CNN, where measured) it went."""
        ceiling = self.real_accuracy if self.real_accuracy is not None else 1.0
        return (self.accuracy - self.chance) / max(ceiling - self.chance, 1e-9)

    @property
    def learned_nothing(self) -> bool:
        return self.accuracy <= self.chance + NOTHING_SHARE * (1 - self.chance)

    def words(self) -> str:
        lift = f" trained at {self.train_side} px and lifted" if self.train_side != self.side else ""
        real = f" (the same CNN on the real images: {self.real_accuracy:.1%})" if self.real_accuracy else ""
        fid = f", FID-inf {self.fid_infinity:.0f}" if self.fid_infinity is not None else ""
        return (f"{self.method}{lift}, epsilon {self.epsilon:g}, --time-budget {self.budget_minutes:g}m: "
                f"{self.data} at {self.side} px {colours(self.channels)}, N = {self.units:,} -> CNN "
                f"{self.accuracy:.1%} (chance {self.chance:.0%}){real}{fid} "
                f"[{self.record}, {self.machine}, {self.date}]")

    def to_dict(self) -> dict[str, Any]:
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}


@cache
def recorded_recipes() -> tuple[Recipe, ...]:
    """The recipes shipped with dpsynth (``dpsynth/autoplan/recipes.json``)."""
    text = resources.files(__package__).joinpath(RECIPES_FILE).read_text()
    return tuple(Recipe(**row) for row in json.loads(text)["recipes"])


@dataclass(frozen=True)
class Recommendation:
    """The recipe recommended for a holder's data (None: no recipe at its side fits), the recipes it was chosen
    from, and whether any of them learned anything."""

    units: int
    side: int
    channels: int
    epsilon: float
    budget_minutes: float
    chosen: Recipe | None
    considered: tuple[Recipe, ...]

    def lines(self) -> list[str]:
        """The recommendation in words, for ``dpsynth privacy``."""
        asked = (f"N = {self.units:,} at {self.side} px {colours(self.channels)}, epsilon {self.epsilon:g}, "
                 f"--time-budget {self.budget_minutes:g}m")
        if self.chosen is None and self.considered:
            return [f"recommended method for {asked}: none measured near this N and epsilon (none within "
                    f"{math.exp(CELL):.2g}x of both); the nearest measured, for reference:",
                    *(f"  measured: {recipe.words()}" for recipe in self.considered)]
        if self.chosen is None:
            return [f"recommended method for {asked}: no measured recipe at {self.side} px {colours(self.channels)} "
                    "within the budget; the own-data guide's recipe table lists the recorded ones"]
        chosen = self.chosen
        if chosen.learned_nothing:
            head = (f"recommended method for {asked}: none measured learned anything at this N and epsilon: train at "
                    f"a lower dataset.train_resolution, give a longer budget or a GPU, start from a model "
                    f"pre-trained on public images (pdp-diffusion), or gather more people; nearest recipes:")
        else:
            lift = (f", trained at {chosen.train_side} px and lifted (dataset.train_resolution={chosen.train_side})"
                    if chosen.train_side != chosen.side else "")
            head = f"recommended method for {asked}: {chosen.method}{lift}; measured:"
        return [head, *(f"  {'chosen' if recipe is chosen and not chosen.learned_nothing else 'measured'}: "
                        f"{recipe.words()}" for recipe in self.considered)]


def recommend(units: int, side: int, channels: int, epsilon: float, budget_minutes: float,
              recipes: tuple[Recipe, ...] | None = None) -> Recommendation:
    """The recipe for ``units`` people (or images) at ``side`` px with ``channels``, ``epsilon`` and
    ``budget_minutes``: of the recipes at that side and channels (grey scans are not photographs) measured within
    the budget, those nearest in (log N, log epsilon); of them the one that went furthest from chance. None is
    chosen (the nearest are listed) where the nearest lies more than :data:`CELL` away: a recipe measured at ten
    times the epsilon says little of this one."""
    recipes = recorded_recipes() if recipes is None else recipes
    fitting = [recipe for recipe in recipes if recipe.side == side and recipe.channels == channels
               and recipe.budget_minutes <= BUDGET_SLACK * budget_minutes]
    if not fitting:
        return Recommendation(units, side, channels, epsilon, budget_minutes, None, ())
    nearest = min(_distance(recipe, units, epsilon) for recipe in fitting)
    considered = tuple(sorted((recipe for recipe in fitting if _distance(recipe, units, epsilon) <= nearest + CELL),
                              key=lambda recipe: -recipe.gain))
    chosen = considered[0] if nearest <= CELL else None
    return Recommendation(units, side, channels, epsilon, budget_minutes, chosen, considered)


def colours(channels: int) -> str:
    """``grey`` or ``RGB`` (or the number of channels)."""
    return {1: "grey", 3: "RGB"}.get(channels, f"{channels} channels")


def _distance(recipe: Recipe, units: int, epsilon: float) -> float:
    """How far ``recipe`` was measured from N = ``units`` and ``epsilon``, in natural-log units."""
    return math.hypot(math.log(units / recipe.units), math.log(epsilon / recipe.epsilon))
