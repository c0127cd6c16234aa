"""What the routes call, between the HTTP edge (:mod:`app.api`) and the worker (:mod:`app.worker`): a request
checked and turned into the plan it runs (:mod:`app.service.planning`, with the ``explain_if`` condition
language of :mod:`app.service.explain_if`), submitted and waited for (:mod:`app.service.service`), and its
answer drawn (:mod:`app.service.render`)."""

from app.service.service import WARM_UP_PHOTO, Checked, RequestContext, Service

__all__ = ["WARM_UP_PHOTO", "Checked", "RequestContext", "Service"]
