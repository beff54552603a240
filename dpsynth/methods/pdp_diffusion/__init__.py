"""PDP-Diffusion (Ghalebikesabi et al. 2023): DPDM's DP-SGD fine-tuning a diffusion model pre-trained on public
data (``dpsynth pretrain --for pdp-diffusion``); the pre-training reads no private data and costs no epsilon."""
from ..declaration import INIT_FROM, Declaration, Paper
from ..dpdm import DECLARATION as DPDM

DECLARATION = Declaration(
    name="pdp-diffusion",
    description="DP-SGD fine-tuning of a diffusion model pre-trained on public data",
    paper=Paper("Sahra Ghalebikesabi, Leonard Berrada, Sven Gowal, Ira Ktena, Robert Stanforth, Jamie Hayes, "
                "Soham De, Samuel L. Smith, Olivia Wiles, Borja Balle",
                "Differentially Private Diffusion Models Generate Useful Synthetic Images", "Preprint", 2023,
                "https://arxiv.org/abs/2302.13861"),
    implementation=f"{__name__}.method:PDPDiffusion",
    shortcuts=INIT_FROM,
    smoke=DPDM.smoke,
)
