"""PrivImage (Li et al. 2024): pre-train only on the public images whose classes the private data resembles, as a DP
histogram of a public classifier's labels picks them, then DP-SGD as PDP-Diffusion."""
from ...diffusion.settings import SMOKE_UNET
from ..declaration import INIT_FROM, Declaration, Paper

DECLARATION = Declaration(
    name="privimage",
    description="pre-training on the public classes a DP semantic histogram selects, then DP-SGD",
    paper=Paper("Kecen Li, Chen Gong, Zhixiang Li, Yuzhong Zhao, Xinwen Hou, Tianhao Wang",
                "PrivImage: Differentially Private Synthetic Image Generation using Diffusion Models with "
                "Semantic-Aware Pretraining", "USENIX Security Symposium", 2024,
                "https://arxiv.org/abs/2311.12850"),
    implementation=f"{__name__}.method:PrivImage",
    shortcuts=INIT_FROM,
    smoke=(*SMOKE_UNET, "dpsgd.batch_size=64", "dpsgd.epochs=0.1", "dpsgd.checkpoint_every=2",
           "selection.public_num_images=124", "selection.top_k=2", "selection.classifier_epochs=1",
           "public_pretrain.iterations=4", "public_pretrain.batch_size=8", "public_pretrain.checkpoint_every=2"),
)
