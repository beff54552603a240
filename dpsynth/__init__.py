"""dpsynth: differentially private image synthesis on one rigorous privacy substrate."""

__version__ = "0.1.0"
