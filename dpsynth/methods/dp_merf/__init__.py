"""DP-MERF (Harder et al. 2021): one release of noisy per-class mean random Fourier features, then a one-step
generator fitted to them; its images are the release."""
from ..declaration import Declaration, Paper

DECLARATION = Declaration(
    name="dp-merf",
    description="a generator fitted to DP per-class mean random Fourier features (fast, no diffusion)",
    paper=Paper("Frederik Harder, Kamil Adamczewski, Mijung Park",
                "DP-MERF: Differentially Private Mean Embeddings with Random Features for Practical "
                "Privacy-Preserving Data Generation",
                "International Conference on Artificial Intelligence and Statistics (AISTATS)", 2021,
                "https://arxiv.org/abs/2002.11603"),
    implementation=f"{__name__}.method:DPMERF",
    smoke=("frequency.features=100", "generator.epochs=1", "generator.iterations_per_epoch=3", "generator.latent=8",
           "generator.width=16"),
)
