"""What a method is, as data that imports no torch: the command line lists the methods and their options, and the
docs and datasheets cite their papers, from the declarations alone; :data:`Declaration.implementation` names the
class that runs it, imported when the method is first looked up."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlparse

# A command-line option that stands for a config key: the key, its help and its metavar (None: the option's name).
Shortcut = tuple[str, str, "str | None"]


@dataclass(frozen=True)
class Paper:
    """The publication a method implements, cited by its docs page and by every release's datasheet."""

    authors: str
    title: str
    venue: str
    year: int
    url: str

    def markdown(self) -> str:
        """``**Paper:** authors. *title.* venue, year. [link](url)``."""
        label = "arXiv:" + self.url.rsplit("/", 1)[1] if "arxiv.org/abs/" in self.url else urlparse(self.url).netloc
        return f"**Paper:** {self.authors}. *{self.title}.* {self.venue}, {self.year}. [{label}]({self.url})"


@dataclass(frozen=True)
class Declaration:
    """A method's name, what it does in a line, the paper it implements and the class that runs it
    (``implementation``: ``module:Class``); its command-line options for its keys (``shortcuts``: option -> key,
    help, metavar), the ``--set`` pairs over its ``cpu`` preset of a smoke run (a few steps of every stage on
    sklearn's digits: ``dpsynth doctor`` and the tests run it) and the keys a resumed run may change
    (``resume_settings``: how it computes, never what)."""

    name: str
    description: str
    paper: Paper
    implementation: str
    shortcuts: Mapping[str, Shortcut] = field(default_factory=dict)
    smoke: tuple[str, ...] = ()
    resume_settings: tuple[str, ...] = ()


# The option of every method that trains a diffusion model (dpsynth.methods.templates.DiffusionMethod).
INIT_FROM: dict[str, Shortcut] = {
    "--init-from": ("model.init_from", "start the diffusion model from one pre-trained on public data "
                                       "(dpsynth pretrain --for METHOD)", "DIR")}
