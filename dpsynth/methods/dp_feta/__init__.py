"""DP-FETA (Li et al.): DP central images warm up the diffusion model, then DP-SGD fine-tunes it."""
from ...diffusion.settings import SMOKE_UNET
from ..declaration import INIT_FROM, Declaration, Paper

DECLARATION = Declaration(
    name="dp-feta",
    description="DP central images warm up a diffusion model, then DP-SGD fine-tuning",
    paper=Paper("Kecen Li, Chen Gong, Xiaochen Li, Yuzhong Zhao, Xinwen Hou, Tianhao Wang",
                "From Easy to Hard: Building a Shortcut for Differentially Private Image Synthesis",
                "IEEE Symposium on Security and Privacy (S&P)", 2025, "https://arxiv.org/abs/2504.01395"),
    implementation=f"{__name__}.method:DPFETA",
    shortcuts=INIT_FROM,
    smoke=(*SMOKE_UNET, "central.count=2", "central.batch_size=300", "central.clip=8.0", "warmup.iterations=4",
           "warmup.batch_size=8", "warmup.checkpoint_every=2", "dpsgd.batch_size=64", "dpsgd.epochs=0.1",
           "dpsgd.checkpoint_every=2"),
)
