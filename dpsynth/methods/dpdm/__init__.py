"""DPDM (Dockhorn et al. 2023): a diffusion model trained with DP-SGD; DP-FETA without its warm-up."""
from ...diffusion.settings import SMOKE_UNET
from ..declaration import INIT_FROM, Declaration, Paper

DECLARATION = Declaration(
    name="dpdm",
    description="diffusion model trained with DP-SGD (the baseline of every seed paper)",
    paper=Paper("Tim Dockhorn, Tianshi Cao, Arash Vahdat, Karsten Kreis", "Differentially Private Diffusion Models",
                "Transactions on Machine Learning Research (TMLR)", 2023, "https://arxiv.org/abs/2210.09929"),
    implementation=f"{__name__}.method:DPDM",
    shortcuts=INIT_FROM,
    smoke=(*SMOKE_UNET, "dpsgd.batch_size=64", "dpsgd.epochs=0.2", "dpsgd.checkpoint_every=2"),
)
