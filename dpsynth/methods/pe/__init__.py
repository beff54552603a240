"""Private Evolution (Lin et al.): no training on private data; a foundation-model API evolves a population
toward the private set, guided only by DP nearest-neighbour votes (Alg. 1-4)."""
from ..declaration import Declaration, Paper

DECLARATION = Declaration(
    name="pe",
    description="Private Evolution: a foundation-model API guided by DP nearest-neighbour votes (no training)",
    paper=Paper("Zinan Lin, Sivakanth Gopi, Janardhan Kulkarni, Harsha Nori, Sergey Yekhanin",
                "Differentially Private Synthetic Data via Foundation Model APIs 1: Images",
                "International Conference on Learning Representations (ICLR)", 2024,
                "https://arxiv.org/abs/2305.15560"),
    implementation=f"{__name__}.method:PrivateEvolution",
    shortcuts={"--api": ("api.name", "PE: the foundation-model API: drawtext, diffusion or one registered "
                                     "(dpsynth.methods.pe.apis.register_api)", None),
               "--api-model": ("api.model", "PE: the diffusers model directory of the diffusion API", None)},
    smoke=("api.name=drawtext", "pe.population=20", "pe.iterations=2", "pe.lookahead=1"),
    resume_settings=("api.batch_size",),
)
