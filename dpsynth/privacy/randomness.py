"""Secret randomness: the stream every DP draw comes from, and torch generators with their whole state secret.

DP noise protects a record only if nobody can recompute it. :class:`SecretStream` is SHAKE-256 (FIPS 202, an
extendable-output function: a cryptographically secure pseudo-random generator) keyed with 256 bits from the
OS (``secrets``); draw number i is ``SHAKE-256(key || i)``. Without the key its outputs cannot be told apart
from true randomness or predicted from earlier outputs, so even an adversary who learns some noise values
(DP's threat model allows knowing every other record) learns nothing about the rest. Its state (key and draw
count) lives in the private checkpoint, so a resumed run repeats an unbroken one bit for bit.

The other streams of a run (model initialisation and training randomness, sampling the release, evaluation)
are torch Mersenne Twisters whose 19,968-bit state is filled from their own secrets (:func:`secret_generator`),
never from ``manual_seed``, which keeps 32 bits. They need no cryptographic strength (DP holds whatever
their values, as long as they do not depend on the data), only independence from the noise stream.

A user-set ``run.seed`` derives every key from the seed and its purpose (tests, benchmarks): such a run's
noise is recomputable by whoever knows the seed, and its privacy report says so.
"""
from __future__ import annotations

import hashlib
import secrets
from typing import Any

import numpy as np
import torch

KEY_BYTES = 32
_MT_WORDS, _MT_OFFSET = 624, 24  # torch's CPU generator state: 3 header words, then 624 uint64 slots


def derived_key(seed: int, purpose: str) -> bytes:
    """The key of stream ``purpose`` for a user-set seed (recomputable: for tests and benchmarks only)."""
    return hashlib.sha256(f"dpsynth/{purpose}/{seed}".encode()).digest()


def fresh_key() -> bytes:
    """256 bits from the operating system's secure source."""
    return secrets.token_bytes(KEY_BYTES)


def stream_key(seed: int | None, purpose: str) -> bytes:
    """The key of stream ``purpose``: fresh from the OS, or derived from a user-set seed."""
    return fresh_key() if seed is None else derived_key(seed, purpose)


class SecretStream:
    """A keyed, counter-based CSPRNG (SHAKE-256) for the DP mechanisms: uniforms, normals, exponentials."""

    def __init__(self, key: bytes, draws: int = 0) -> None:
        if len(key) < 16:
            raise ValueError("a secret stream needs a key of at least 128 bits")
        self._key, self._draws = bytes(key), int(draws)

    @classmethod
    def fresh(cls) -> SecretStream:
        return cls(fresh_key())

    def _words(self, count: int) -> np.ndarray:
        """``count`` uniform uint64 words from the next draw."""
        message = self._key + self._draws.to_bytes(8, "little")
        self._draws += 1
        return np.frombuffer(hashlib.shake_256(message).digest(8 * count), dtype="<u8")

    def uniform(self, shape: int | tuple[int, ...] | torch.Size) -> torch.Tensor:
        """float64 uniforms in the open interval (0, 1) (:func:`uniforms`)."""
        size = torch.Size((shape,) if isinstance(shape, int) else shape)
        return uniforms(self._words(size.numel())).reshape(size)

    def normal(self, shape: int | tuple[int, ...] | torch.Size) -> torch.Tensor:
        """float64 standard normals, exactly symmetric (:func:`normals`)."""
        size = torch.Size((shape,) if isinstance(shape, int) else shape)
        return normals(self._words(size.numel())).reshape(size)

    def exponential(self, shape: int | tuple[int, ...] | torch.Size) -> torch.Tensor:
        """float64 Exp(1) draws."""
        return -torch.log(self.uniform(shape))

    def get_state(self) -> dict[str, Any]:
        return {"key": self._key.hex(), "draws": self._draws}

    def set_state(self, state: dict[str, Any]) -> None:
        self._key, self._draws = bytes.fromhex(state["key"]), int(state["draws"])

    def __repr__(self) -> str:  # never show the key
        return f"SecretStream(draws={self._draws})"


def uniforms(words: np.ndarray) -> torch.Tensor:
    """float64 uniforms from uint64 words: the grid (k + 1/2) 2^-52, k < 2^52 the top 52 bits, inside the open
    interval (0, 1) (never 0 or 1, every value exact in float64) and symmetric (u and 1 - u equally likely)."""
    return torch.from_numpy(_grid(words >> np.uint64(12), 52))


def normals(words: np.ndarray) -> torch.Tensor:
    """float64 standard normals from uint64 words, exactly symmetric: the top bit a sign, times ndtri(p) for p on
    the grid (k + 1/2) 2^-53 of (0, 1/2), k the low 52 bits; so |z| <= 8.29 on both sides."""
    lower = torch.special.ndtri(torch.from_numpy(_grid(words & np.uint64(2 ** 52 - 1), 53)))
    return torch.from_numpy((words >> np.uint64(63)).astype(np.float64) * 2 - 1) * lower


def _grid(values: np.ndarray, bits: int) -> np.ndarray:
    """(values + 1/2) 2^-bits in float64 (exact for values below 2^52)."""
    return (values.astype(np.float64) + 0.5) * 2.0 ** -bits


def secret_generator(key: bytes) -> torch.Generator:
    """A CPU torch generator whose whole Mersenne Twister state is expanded from ``key`` (not 32 bits of it)."""
    generator = torch.Generator()
    generator.set_state(mersenne_state(key))
    return generator


def mersenne_state(key: bytes) -> torch.Tensor:
    """A torch CPU generator state (``get_state`` layout) whose 624 words come from SHAKE-256(key)."""
    template = torch.Generator().manual_seed(0).get_state().numpy().copy()
    words = np.frombuffer(hashlib.shake_256(b"mt19937" + key).digest(4 * _MT_WORDS), dtype="<u4")
    slots = template[_MT_OFFSET:_MT_OFFSET + 8 * _MT_WORDS].view("<u8")
    slots[:] = words.astype(np.uint64)
    template[:8] = 0  # the initial-seed field: nothing of the key
    return torch.from_numpy(template)
