"""A progress bar that shows the privacy budget spent so far."""
from __future__ import annotations

import math
import time
from collections.abc import Mapping

import torch
from tqdm.auto import tqdm

from .accountant import Accountant
from .ledger import PrivacyLedger


class PrivacyProgress:
    """tqdm over ``total`` steps whose postfix is the epsilon of the ledger so far and, given the seconds the run
    expects after these steps (``after_seconds``: sampling, evaluation), the clock time the whole run should end.

    Accounting a ledger with PLD takes about two seconds, so epsilon is recomputed at most every
    ``refresh_seconds`` and once more on close. Metrics may be 0-d tensors on a GPU: they are read (which waits
    for the GPU) at most once a second. A disabled bar (ranks other than 0) shows and accounts nothing.
    """

    def __init__(self, total: int, ledger: PrivacyLedger, accountant: Accountant, delta: float, desc: str,
                 initial: int = 0, refresh_seconds: float = 60.0, enabled: bool = True,
                 after_seconds: float | None = None) -> None:
        self.ledger, self.accountant, self.delta = ledger, accountant, delta
        self.refresh_seconds = refresh_seconds
        self.enabled = enabled
        self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, disable=not enabled)
        self._last = self._shown = -float("inf")
        self.epsilon = 0.0
        self.after_seconds = after_seconds
        self._began, self._initial, self.total = time.monotonic(), initial, total

    def update(self, metrics: Mapping[str, float | torch.Tensor] | None = None, n: int = 1) -> None:
        """Advance by ``n`` steps, showing ``metrics`` (at most once a second) and (refreshed when due) epsilon."""
        if self.enabled and time.monotonic() - self._last >= self.refresh_seconds:
            self._refresh_epsilon()
        if self.enabled and time.monotonic() - self._shown >= 1.0:
            shown = {k: f"{float(v.detach() if isinstance(v, torch.Tensor) else v):.4g}"
                     for k, v in (metrics or {}).items()}
            self.bar.set_postfix({"eps": self._shown_epsilon(), **shown, **self._run_ends(n)}, refresh=False)
            self._shown = time.monotonic()
        self.bar.update(n)

    def _run_ends(self, n: int) -> dict[str, str]:
        """``run ends``: the clock time the whole run should end at (the steps left at this session's pace, then
        what the plan expects after them); nothing without an expectation or a step yet."""
        done = self.bar.n + n - self._initial
        if self.after_seconds is None or done <= 0:
            return {}
        left = (time.monotonic() - self._began) / done * (self.total - self.bar.n - n) + self.after_seconds
        return {"run ends": time.strftime("%H:%M", time.localtime(time.time() + left))}

    def _shown_epsilon(self) -> str:
        """Epsilon so far; "none" once a stage used the data without noise (no guarantee, no number)."""
        return f"{self.epsilon:.3f}" if math.isfinite(self.epsilon) else "none"

    def _refresh_epsilon(self) -> None:
        self.epsilon = self.accountant.epsilon(self.ledger.events("synthesis"), self.delta)
        self._last = time.monotonic()

    def close(self) -> float:
        """Close the bar and return the final epsilon (0 when disabled)."""
        if self.enabled:
            self._refresh_epsilon()
        self.bar.set_postfix({"eps": self._shown_epsilon()})
        self.bar.close()
        return self.epsilon
