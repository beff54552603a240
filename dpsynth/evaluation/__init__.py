"""Evaluation: FID / KID / precision-recall on TF-FID Inception features, downstream accuracy, pictures."""
from .evaluate import METRICS, EvaluationSettings, evaluate_release
from .fidelity import Moments, fid, fid_infinity, kid, precision_recall
from .inception import InceptionFeatures
from .release import Release, load_release, read_release, selection_ledger

__all__ = ["METRICS", "EvaluationSettings", "InceptionFeatures", "Moments", "Release", "evaluate_release",
           "fid", "fid_infinity", "kid", "load_release", "precision_recall", "read_release", "selection_ledger"]
