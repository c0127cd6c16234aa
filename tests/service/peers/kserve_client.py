"""KServe's own Python clients (the ``kserve`` package, 0.21), unmodified, against a running server: run in a process
of their own (``python kserve_client.py HTTP_URL GRPC_ADDRESS MODEL`` with the images as a JSON list of base64 strings
on stdin) because kserve pins protobuf and psutil below this project's, so it lives in a folder of its own
(``scripts/setup.sh dev`` puts it in ``.venv/peers/kserve``) put first on ``PYTHONPATH``. Prints one JSON object: each
call's model name, output shapes and predicted classes, what the server said to a body naming another model, and the
``regions`` output (XRAI's ranked regions) as each protocol's client reads it."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import Any

import httpx
import kserve  # type: ignore[import-not-found]
import numpy as np
from kserve.protocol.infer_type import RequestedOutput  # type: ignore[import-not-found]


def _outputs(answer: Any) -> dict[str, Any]:
    outputs = {o.name: o.as_numpy() for o in answer.outputs}
    return {"model_name": answer.model_name, "shape": list(outputs["probabilities"].shape),
            "predicted": outputs["predicted_class"].tolist(), "argmax": outputs["probabilities"].argmax(1).tolist()}


async def main(http_url: str, grpc_address: str, model: str, images: list[bytes]) -> dict[str, Any]:
    rest = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", timeout=60))
    as_json = kserve.InferInput(name="image", shape=[len(images)], datatype="BYTES",
                                data=[base64.b64encode(i).decode() for i in images])
    in_binary = kserve.InferInput(name="image", shape=[len(images)], datatype="BYTES")
    in_binary.set_data_from_numpy(np.array(images, dtype=np.object_), binary_data=True)
    found: dict[str, Any] = {}
    for name, tensor in (("rest_json", as_json), ("rest_binary", in_binary)):
        found[name] = _outputs(await rest.infer(http_url, kserve.InferRequest(model_name=model, infer_inputs=[tensor]),
                                                model_name=model))
    try:
        await rest.infer(http_url, kserve.InferRequest(model_name="other", infer_inputs=[as_json]), model_name=model)
        found["rest_other_model"] = "answered"
    except httpx.HTTPStatusError as err:
        found["rest_other_model"] = f"{err.response.status_code} {err.response.text}"
    grpc = kserve.InferenceGRPCClient(grpc_address, timeout=60)
    raw = kserve.InferInput(name="image", shape=[len(images)], datatype="BYTES")
    raw.set_data_from_numpy(np.array(images, dtype=np.object_))
    found["grpc"] = _outputs(await grpc.infer(kserve.InferRequest(model_name=model, infer_inputs=[raw])))
    for name, client in (("rest", None), ("grpc", grpc)):  # XRAI's ranked regions of the first image, as an output asked
        one = kserve.InferInput(name="image", shape=[1], datatype="BYTES", data=[base64.b64encode(images[0]).decode()])
        if client is not None:
            one = kserve.InferInput(name="image", shape=[1], datatype="BYTES")
            one.set_data_from_numpy(np.array(images[:1], dtype=np.object_))
        asked = kserve.InferRequest(model_name=model, infer_inputs=[one], parameters=REGIONS,
                                    request_outputs=[RequestedOutput("regions")])
        answer = await (rest.infer(http_url, asked, model_name=model) if client is None else client.infer(asked))
        found[f"{name}_regions"] = _regions(answer)
    await rest.close()
    await grpc.close()
    return found


REGIONS = {"method": "ig", "steps": 4, "postprocess": "xrai"}
"""The parameters of the calls that ask for the ``regions`` output."""


def _regions(answer: Any) -> dict[str, Any]:
    outputs = {o.name: o.as_numpy() for o in answer.outputs}
    ranks = outputs["regions"]
    return {"outputs": sorted(outputs), "dtype": str(ranks.dtype), "shape": list(ranks.shape),
            "ranks": sorted(set(np.unique(ranks).tolist()))}


if __name__ == "__main__":
    pictures = [base64.b64decode(s) for s in json.load(sys.stdin)]
    json.dump(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], pictures)), sys.stdout)
