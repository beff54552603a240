"""DP-LDM (Lyu et al. 2023): DP-SGD on the latents of an autoencoder trained on public data, decoded at release."""
from ..declaration import INIT_FROM, Declaration, Paper
from ..dpdm import DECLARATION as DPDM

DECLARATION = Declaration(
    name="dp-ldm",
    description="diffusion model trained with DP-SGD on the latents of a public autoencoder",
    paper=Paper("Michael F. Liu, Saiyue Lyu, Margarita Vinaroz, Mijung Park",
                "DP-LDMs: Differentially Private Latent Diffusion Models",
                "Transactions on Machine Learning Research (TMLR)", 2024,
                "https://arxiv.org/abs/2305.15759"),
    implementation=f"{__name__}.method:DPLDM",
    shortcuts=INIT_FROM,
    smoke=(*DPDM.smoke, "autoencoder.iterations=2"),
    resume_settings=("autoencoder.encode_batch",),
)
