"""Moved to :mod:`idg_client` (the client is a package of its own, installable without the server); this
name stays for code that imports it from here."""

from idg_client.client import (
    ARCHIVE_SUFFIXES,
    IMAGE_SUFFIXES,
    AsyncClient,
    Attribution,
    ClassScore,
    Client,
    ImageInput,
    OutputCurve,
    Prediction,
    ServiceError,
    image_files,
    parse_attribution,
    parse_prediction,
)

__all__ = ["ARCHIVE_SUFFIXES", "IMAGE_SUFFIXES", "AsyncClient", "Attribution", "ClassScore", "Client", "ImageInput", "OutputCurve",
           "Prediction", "ServiceError", "image_files", "parse_attribution", "parse_prediction"]
