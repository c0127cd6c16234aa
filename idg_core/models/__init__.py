"""Pretrained classifiers (pixel space in, logits out) and the image preprocessing they need."""

from idg_core.models.models_file import ModelSettings, read_models_file
from idg_core.models.preprocess import (
    ImageDecodeError,
    ImageTooLargeError,
    decode_image,
    image_files,
    resize_crop,
    to_rgb,
    to_tensor,
)
from idg_core.models.sources import ModelSpec, load_entry, load_source, parse_spec
from idg_core.models.speed import (
    PRECISIONS,
    Precision,
    default_channels_last,
    default_precision,
    fold_batchnorm,
    keep_freed_memory,
    set_tf32,
    tune,
)
from idg_core.models.zoo import (
    LITE_SIZES,
    TORCHVISION_ARCHS,
    ImageClassifier,
    Preprocessing,
    efficientnet_lite,
    imagenet_class_names,
    imagenet_label,
    imagenet_wnids,
    load_model,
    torchvision_classifier,
)

__all__ = [
    "LITE_SIZES",
    "PRECISIONS",
    "TORCHVISION_ARCHS",
    "ImageClassifier",
    "ImageDecodeError",
    "ModelSettings",
    "ModelSpec",
    "ImageTooLargeError",
    "Precision",
    "default_channels_last",
    "default_precision",
    "fold_batchnorm",
    "keep_freed_memory",
    "Preprocessing",
    "decode_image",
    "efficientnet_lite",
    "image_files",
    "imagenet_class_names",
    "imagenet_label",
    "imagenet_wnids",
    "load_entry",
    "load_model",
    "load_source",
    "parse_spec",
    "read_models_file",
    "resize_crop",
    "set_tf32",
    "to_rgb",
    "to_tensor",
    "torchvision_classifier",
    "tune",
]
