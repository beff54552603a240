"""DP-ImgSyn (Soufleri et al.): public images aligned to a DP teacher's DP batch statistics, released with the
teacher's soft labels; a non-generative method."""
from ..declaration import Declaration, Paper

DECLARATION = Declaration(
    name="dp-imgsyn",
    description="DP-ImgSyn: public images aligned to a DP teacher's DP statistics, released with soft labels",
    paper=Paper("Efstathia Soufleri, Deepak Ravikumar, Kaushik Roy",
                "DP-ImgSyn: Dataset Alignment for Obfuscated, Differentially Private Image Synthesis",
                "Transactions on Machine Learning Research (TMLR)", 2024,
                "https://openreview.net/forum?id=KleJZ9ZzYw"),
    implementation=f"{__name__}.method:DPImgSyn",
    shortcuts={"--public": ("alignment.public", "DP-ImgSyn: the public dataset whose images are aligned", None)},
    smoke=("teacher.blocks=[1, 1]", "teacher.widths=[8, 16]", "teacher.groups=4", "teacher.batch_size=128",
           "teacher.epochs=0.2", "teacher.checkpoint_every=1", "alignment.init=noise", "alignment.iterations=2",
           "alignment.batch_size=10", "alignment.temperature=4"),
    resume_settings=("statistics.batch_size",),
)
