"""dpsynth: differentially private image synthesis on one rigorous privacy substrate."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``dpsynth.Synthesizer`` (:mod:`dpsynth.estimator`), imported when first used: ``import dpsynth`` stays light."""
    if name == "Synthesizer":
        from .estimator import Synthesizer

        return Synthesizer
    raise AttributeError(f"module 'dpsynth' has no attribute {name!r}")
