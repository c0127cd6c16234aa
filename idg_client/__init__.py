"""The service's Python client and the ``idg-client`` command: a package of its own that imports nothing from
the server (``app``) or the library (``idg_core``, torch), so it installs alone (``pip install ./idg_client``:
httpx, numpy, Pillow) on a machine that only calls the service.

    from idg_client import Client
    with Client("http://127.0.0.1:8000") as c:
        res = c.attribute("photo.jpg", method="idg", steps=50)
"""

from idg_client.client import (
    ARCHIVE_SUFFIXES,
    IMAGE_SUFFIXES,
    AsyncClient,
    AsyncJobResults,
    Attribution,
    ClassScore,
    Client,
    ImageInput,
    JobResults,
    OutputCurve,
    Prediction,
    Regions,
    ServiceError,
    image_files,
    parse_attribution,
    parse_prediction,
    parse_regions,
)

__all__ = ["ARCHIVE_SUFFIXES", "IMAGE_SUFFIXES", "AsyncClient", "AsyncJobResults", "Attribution", "ClassScore", "Client",
           "ImageInput", "JobResults", "OutputCurve", "Prediction", "Regions", "ServiceError", "image_files",
           "parse_attribution", "parse_prediction", "parse_regions"]
