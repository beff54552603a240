"""FETA-Pro (Li et al.): spatial (central images) -> frequency (random Fourier features) -> DP-SGD curriculum."""
from ..declaration import INIT_FROM, Declaration, Paper
from ..dp_feta import DECLARATION as DP_FETA

DECLARATION = Declaration(
    name="feta-pro",
    description="central images and DP random Fourier features (via an auxiliary generator) warm up, then DP-SGD",
    paper=Paper("Chen Gong, Kecen Li, Zinan Lin, Tianhao Wang",
                "From Easy to Hard++: Promoting Differentially Private Image Synthesis Through Spatial-Frequency "
                "Curriculum", "Preprint", 2026, "https://arxiv.org/abs/2601.06368"),
    implementation=f"{__name__}.method:FETAPro",
    shortcuts=INIT_FROM,
    smoke=(*DP_FETA.smoke, "frequency.features=100", "generator.epochs=1", "generator.iterations_per_epoch=3",
           "generator.images=40", "generator.latent=8", "generator.width=16", "frequency_warmup.iterations=4",
           "frequency_warmup.batch_size=8", "frequency_warmup.checkpoint_every=2", "frequency_warmup.sample_steps=2"),
)
