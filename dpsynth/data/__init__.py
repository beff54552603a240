"""Datasets: loaders for standard formats and your own folders, split into train / val / test."""
from .base import Dataset, DatasetInfo, ImageSet
from .registry import DATASETS, DatasetSource, get_source, load_dataset, load_public

__all__ = ["DATASETS", "Dataset", "DatasetInfo", "DatasetSource", "ImageSet", "get_source", "load_dataset",
           "load_public"]
