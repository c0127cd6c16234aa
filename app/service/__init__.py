"""What the routes call, between the HTTP edge (:mod:`app.api`) and the worker (:mod:`app.worker`): a request
checked and turned into the plan it runs (:mod:`app.service.planning`, with the ``explain_if`` condition
language of :mod:`app.service.explain_if`), submitted and waited for (:mod:`app.service.service`), and its
answer drawn (:mod:`app.service.render`). The doors build one typed request (:mod:`app.service.calls`) and call one
of :meth:`Service.predict`, :meth:`Service.attribute`, :meth:`Service.explanation` or :meth:`Service.probabilities`."""

from app.service.calls import BACKGROUND_PRIORITY, ExplainRequest, Image, PredictRequest, RequestContext
from app.service.service import WARM_UP_PHOTO, Checked, Explained, Service

__all__ = ["BACKGROUND_PRIORITY", "WARM_UP_PHOTO", "Checked", "ExplainRequest", "Explained", "Image", "PredictRequest",
           "RequestContext", "Service"]
