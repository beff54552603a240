"""DP-SAD (stochastic adversarial distillation): a student diffusion model distilled from a teacher, with a
discriminator, one random time step per example and per-example clipping at the student's output."""
from ...diffusion.settings import SMOKE_UNET
from ..declaration import INIT_FROM, Declaration, Paper

DECLARATION = Declaration(
    name="dp-sad",
    description="student diffusion model distilled from a DP teacher with a discriminator (sound DP-SAD)",
    paper=Paper("Bochao Liu, Pengju Wang, Shiming Ge",
                "Learning Differentially Private Diffusion Models via Stochastic Adversarial Distillation",
                "European Conference on Computer Vision (ECCV)", 2024, "https://arxiv.org/abs/2408.14738"),
    implementation=f"{__name__}.method:DPSAD",
    shortcuts=INIT_FROM,
    smoke=(*SMOKE_UNET, "teacher.batch_size=64", "teacher.epochs=0.1", "teacher.checkpoint_every=2",
           "student.batch_size=64", "student.epochs=0.1", "student.checkpoint_every=2", "discriminator.pool=20",
           "discriminator.pool_steps=2", "discriminator.batch_size=8"),
)
