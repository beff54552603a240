"""One process of the distributed tests: ``python distributed_worker.py SCENARIO OUT_DIR`` alone or under torchrun.

Each rank writes ``OUT_DIR/rank<r>.json`` with what it saw, for tests/test_distributed.py to compare.
Scenarios: ``dpsgd`` (the engine's samples, noise and sums) and ``pe`` (PE's votes and lookahead embeddings).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpsynth.data import load_dataset
from dpsynth.distributed import World
from dpsynth.privacy import Accountant, Event, LedgerPlan, PrivacyLedger, SubsampledGaussianMechanism
from dpsynth.privacy.dpsgd import DPSGD, DpsgdSettings
from dpsynth.privacy.mechanisms import clip_rows
from dpsynth.privacy.randomness import SecretStream, derived_key
from dpsynth.runs import RunDirectory
from dpsynth.training.context import RunContext

SEED, SIGMA, CLIP = 7, 2.0, 1.0


def context(world: World, out: Path, plan: dict[str, list[Event]] | None = None) -> RunContext:
    return RunContext(dataset=load_dataset("digits"), run=RunDirectory(out),
                      ledger=PrivacyLedger(plan=LedgerPlan(plan or {})), accountant=Accountant("pld"), delta=1e-5,
                      device=torch.device("cpu"), generator=torch.Generator().manual_seed(SEED),
                      noise=SecretStream(derived_key(SEED, "test")), world=world)


def linear_loss(model: Any, x: torch.Tensor) -> torch.Tensor:
    """Per example x . w: its gradient is x itself, so clipped sums are known in closed form."""
    return model(x.unsqueeze(0)).sum()


def dpsgd(world: World, out: Path) -> dict[str, Any]:
    """Five noisy steps on a zero gradient (the update is the noise) and one exact step (all examples,
    negligible noise): the indices each rank processed, the noise std, and the exact sum against its formula."""
    data = torch.randn(1000, 20000, generator=torch.Generator().manual_seed(1)) * 0.02
    ctx = context(world, out, {"dp-sgd": [SubsampledGaussianMechanism(SIGMA, 0.1, 5),
                                          SubsampledGaussianMechanism(1e-9, 1.0, 1)]})
    model = nn.Linear(20000, 1, bias=False)
    nn.init.zeros_(model.weight)
    seen: list[list[int]] = []

    def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor]:
        seen[-1].extend(indices.tolist())
        return (data[indices],)

    def steps(noise: float, rate: float, loss: Any, count: int) -> torch.Tensor:
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        engine = DPSGD(model, optimizer, loss, settings=DpsgdSettings(noise, CLIP, rate, 128), num_records=len(data),
                       ledger=ctx.ledger, stage="dp-sgd", noise=ctx.noise, world=world, generator=ctx.generator,
                       example_generator=ctx.example_generator)
        updates = []
        for _ in range(count):
            seen.append([])
            before = model.weight.detach().clone()
            engine.step(make_batch)
            updates.append((before - model.weight.detach()) * rate * len(data))  # the noisy sum itself
        return torch.stack(updates)

    noise = steps(SIGMA, 0.1, lambda m, x: (m(x.unsqueeze(0)) * 0).sum(), 5)
    exact = steps(1e-9, 1.0, linear_loss, 1)[0].flatten()
    expected = clip_rows(data, CLIP).sum(0)
    return {"seen": seen, "noise_std": float(noise.std()), "exact_error": float((exact - expected).abs().max()),
            "weights": model.weight.detach().flatten()[:5].tolist(), "ledger": ctx.ledger.to_dict()}


def pe(world: World, out: Path) -> dict[str, Any]:
    """PE's vote vector (shards' votes all-reduced) and its lookahead embeddings split over the ranks."""
    from dpsynth.methods.pe.apis import Samples  # PE's modules (diffusers among their imports) for this scenario only
    from dpsynth.methods.pe.embeddings import PixelEmbedding
    from dpsynth.methods.pe.population import Population, PrivateVotes
    from dpsynth.privacy.nearest_neighbours import nearest_neighbour_votes

    ctx = context(world, out)
    synthetic = Samples(torch.rand(40, 1, 8, 8, generator=torch.Generator().manual_seed(2)))
    embed = PixelEmbedding()
    (embedded,) = Population(None, [synthetic]).lookahead(ctx, embed, 0, 1.0)  # type: ignore[arg-type]
    shard, weights = ctx.private_shard()
    private = PrivateVotes.of(shard, weights, 10, embed, 1.0, 0.0, "histograms")
    votes = nearest_neighbour_votes(torch.cat(private.private), embedded, torch.cat(private.weights))
    world.all_reduce_sum([votes])
    return {"votes": votes.tolist(), "embedding_error": float((embedded - embed(synthetic.images)).abs().max()),
            "shard": len(shard)}


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    world = World.from_environment(torch.device("cpu"))
    result = {"dpsgd": dpsgd, "pe": pe}[scenario](world, out)
    (out / f"rank{world.rank}.json").write_text(json.dumps({"world": world.size, **result}))
    world.close()


if __name__ == "__main__":
    main()
