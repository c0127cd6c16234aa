"""The Open Inference Protocol's (KServe v2) REST bodies: reading an inference request, tensors
included, and writing the answer. The routes are :mod:`app.api.routes.v2`.

Tensor data comes as JSON (``data``, row-major, nested or flat) or, with Triton's binary tensor
data extension (what ``tritonclient.http`` sends by default), as raw bytes after the JSON header:
the header's length in ``Inference-Header-Content-Length``, each input's byte count in its
``binary_data_size`` parameter. ``BYTES`` elements are base64 strings in JSON (KServe's
convention for images) and 4-byte little-endian length-prefixed in binary. An output is written in
binary when its ``binary_data`` parameter is true (or, with no outputs listed, the request's
``binary_data_output``). Every refusal is an :class:`ApiError` that the v2 routes answer as
``{"error": "..."}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import secrets
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError

from app.core.errors import ApiError
from app.doors.request_id import current_request_id

Scalar = str | int | float | bool
HEADER_LENGTH = "inference-header-content-length"
DTYPES: dict[str, np.dtype[Any]] = {"FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"), "UINT8": np.dtype("u1"),
                                    "INT64": np.dtype("<i8"), "INT32": np.dtype("<i4")}
"""The numeric tensor types this service reads or writes (and ``BYTES``)."""
MAX_DIMS = 8
"""The most dimensions an input's shape may have (the service's inputs have at most 4; NumPy takes at most 64)."""


def bad(message: str, status: int = 400, code: str = "invalid_request") -> ApiError:
    return ApiError(status, message, code=code)


INPUT_KINDS: dict[str, tuple[str, ...]] = {"image": ("BYTES",), "input": ("FP32", "UINT8")}
"""The inputs the service reads, each with the datatypes it takes (the routes refuse the others with a 400)."""
INPUT_SHAPES: dict[str, dict[str, Any]] = {
    "image": {"minItems": 1, "maxItems": 1, "items": {"minimum": 1}},  # [N]: N encoded files
    "input": {"minItems": 4, "maxItems": 4, "prefixItems": [{"minimum": 1}]},  # N pixel images, NCHW or NHWC: the model's size
}
"""Each input's shape, as far as the schema can say it: at least one image in the batch dimension."""


def _whole(value: Any) -> Any:
    """A JSON number without a fraction (``2.0``) as the integer it is: JSON Schema's ``integer`` takes it, as the
    /attribute fields do (issue 59: a shape of ``[1.0]`` was refused); ``1.5``, ``"1"`` and ``true`` stay refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Dimension = Annotated[StrictInt, BeforeValidator(_whole)]


def _an_array(schema: dict[str, Any]) -> None:
    """``data`` as the documented JSON body has it: a JSON array, no default (null is refused)."""
    schema["type"] = "array"
    schema.pop("default", None)


class RequestInput(BaseModel):
    # what the documented JSON body states beyond the fields' types (issue 59, schemathesis: the schema had taken inputs the
    # server refuses): each input's name with its datatypes, and its elements in `data` (in a JSON body: the binary
    # extension's inputs carry binary_data_size instead, in a body that is not JSON alone; see the route's requestBody)
    model_config = ConfigDict(extra="forbid", json_schema_extra={"required": ["name", "shape", "datatype", "data"], "anyOf": [
        {"properties": {"name": {"const": name}, "datatype": {"enum": list(kinds)}, "shape": INPUT_SHAPES[name]}}
        for name, kinds in INPUT_KINDS.items()]})
    name: str = Field(..., description="The input's name: `image` (BYTES, encoded image files) or `input` (FP32 / UINT8 pixels)")
    shape: list[Dimension] = Field(..., max_length=MAX_DIMS, description="The tensor's shape (JSON integers, at most 8 of them, "
                                   "none negative); the first dimension is the batch",
                                   json_schema_extra={"items": {"type": "integer", "minimum": 0}})
    datatype: str = Field(..., description="BYTES, FP32 or UINT8")
    parameters: dict[str, Scalar] = Field(default_factory=dict, description="binary_data_size (binary extension); "
                                          "layout: NCHW or NHWC for `input` (default: from the shape)")
    data: Any = Field(None, description="Row-major elements, nested or flat (a JSON array); absent when sent in binary",
                      json_schema_extra=_an_array)


class RequestOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., description="An output of the model's metadata")
    parameters: dict[str, Scalar] = Field(default_factory=dict, description="binary_data (bool); classification: "
                                          "top-k as 'value:index:label' strings (on `probabilities` only)")


class InferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    id: str | None = Field(None, description="Returned in the answer")
    model_name: str | None = Field(None, description="The path's model, if given (KServe's InferenceRESTClient sends it): "
                                   "another name is a 400")
    model_version: str | None = Field(None, description="The path's version, if given: '1' or empty (the one version); "
                                      "another is a 400")
    parameters: dict[str, Scalar] = Field(default_factory=dict, description="The /attribute fields that select the explanation "
                                          "(method, preset, target, steps, faithfulness, ...); explain: true to explain with defaults")
    inputs: list[RequestInput] = Field(..., min_length=1, description="Exactly one: `image` or `input`",
                                       json_schema_extra={"maxItems": 1})
    outputs: list[RequestOutput] | None = Field(None, description="Outputs to return; default: the classification outputs, "
                                                "and the explanation outputs when an explanation runs")


class MetadataTensor(BaseModel):
    name: str = Field(..., description="The tensor's name, as a request or an answer names it")
    datatype: str = Field(..., description="Element type: BYTES, FP32, INT64, ...")
    shape: list[int] = Field(..., description="The shape; -1 for a dimension of any size (the first is the batch)")


class ModelMetadata(BaseModel):
    name: str = Field(..., description="The model's name, as in the path")
    versions: list[str] = Field(default_factory=list, description="The model's versions: always ['1'] (the service does not "
                                "version its models; /v2/models/NAME/versions/1/... is /v2/models/NAME/...)")
    platform: str = Field(..., description="pytorch_torchscript for a TorchScript model, else pytorch")
    inputs: list[MetadataTensor] = Field(..., description="The inputs a request may give (one of them)")
    outputs: list[MetadataTensor] = Field(..., description="The outputs an answer may hold")


class ConfigTensor(BaseModel):
    name: str = Field(..., description="The tensor's name")
    data_type: str = Field(..., description="Triton's type name: TYPE_STRING, TYPE_FP32, TYPE_INT64, TYPE_INT32")
    dims: list[int] = Field(..., description="The shape without the batch dimension; -1 for any size")
    format: str | None = Field(None, description="FORMAT_NONE (encoded files) or FORMAT_NCHW (pixels), on inputs")
    reshape: dict[str, list[int]] | None = Field(None, description="{'shape': []} where a request's shape is the batch's only")


class ModelConfig(BaseModel):
    """Triton's model configuration (``ModelConfig``, as its JSON), for Triton's clients (``get_model_config``)."""

    name: str = Field(..., description="The model's name")
    platform: str = Field(..., description="pytorch_torchscript for a TorchScript model, else pytorch")
    max_batch_size: int = Field(..., description="Most images in one request (IDG_MAX_BATCH_FILES)")
    input: list[ConfigTensor] = Field(..., description="The inputs a request may give (one of them)")
    output: list[ConfigTensor] = Field(..., description="The outputs an answer may hold")


class RepositoryModel(BaseModel):
    name: str = Field(..., description="The model's name")
    version: str = Field(..., description="Its version: always '1'")
    state: str = Field(..., description="READY: loaded and warm (the service serves no other)")


class ServerMetadata(BaseModel):
    name: str = Field(..., description="The server's name")
    version: str = Field(..., description="The server's version")
    extensions: list[str] = Field(..., description="Protocol extensions supported (Triton's names)")


class ServerLive(BaseModel):
    live: bool = Field(..., description="True while the process serves HTTP")


class ServerReady(BaseModel):
    ready: bool = Field(..., description="True once every model is loaded and warm (503 and false otherwise)")


class ModelReady(BaseModel):
    name: str = Field(..., description="The model's name")
    ready: bool = Field(..., description="True: loaded and warm (a model that is not answers 503 or 404)")


class ResponseOutput(BaseModel):
    name: str = Field(..., description="The output's name")
    shape: list[int] = Field(..., description="The tensor's shape; the first dimension is the batch")
    datatype: str = Field(..., description="FP32, INT64 or BYTES")
    parameters: dict[str, Scalar] = Field(default_factory=dict, description="binary_data_size when its data follows the JSON in "
                                          "binary; output ('logit' or 'probability') on curve_value")
    data: list[Any] | None = Field(None, description="Row-major elements, flattened (absent when sent in binary)")


class InferResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model_name: str = Field(..., description="The model that answered")
    id: str | None = Field(None, description="The request's id, or its X-Request-ID when it gave none")
    parameters: dict[str, Scalar] = Field(default_factory=dict, description="total_ms: milliseconds from receiving the request")
    outputs: list[ResponseOutput] = Field(..., description="The outputs, in the order asked")


class ProtocolError(BaseModel):
    error: str = Field(..., description="What went wrong, in one sentence (the protocol's error form)")


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with its nested models written in place (for a route's documented body)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: resolve(v) for k, v in node.items()}
        return [resolve(v) for v in node] if isinstance(node, list) else node

    return dict(resolve(schema))


@dataclass
class Tensor:
    """One input tensor, decoded: a numeric array, or the elements of a BYTES tensor."""

    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Scalar]
    array: np.ndarray[Any, Any] | None = None
    items: list[bytes] = field(default_factory=list)


def _count(shape: list[int]) -> int:
    if any(d < 0 for d in shape):
        raise bad(f"shape {shape} has a negative dimension")
    return math.prod(shape)


def _split_bytes(raw: bytes, name: str) -> list[bytes]:
    """Triton's BYTES serialisation: each element as a 4-byte little-endian length, then its bytes."""
    items, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise bad(f"input {name!r}: binary BYTES data ends inside an element's 4-byte length")
        (size,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + size > len(raw):
            raise bad(f"input {name!r}: a BYTES element declares {size} bytes, only {len(raw) - pos} remain")
        items.append(raw[pos:pos + size])
        pos += size
    return items


def _flat(data: Any, name: str) -> list[Any]:
    """Row-major elements of a nested JSON array."""
    if not isinstance(data, list):
        raise bad(f"input {name!r}: data must be a JSON array")
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def json_numbers(items: list[Any], dtype: np.dtype[Any], name: str, datatype: str) -> np.ndarray:
    """JSON elements as ``dtype``, each exactly what it says: integers (not booleans) in range for an integer type,
    finite numbers for a float type. NumPy's own cast had truncated 0.7 to 0 for UINT8 (a [0, 1] photo sent as UINT8
    read as black), wrapped or refused by value, and read "0.5" and true as numbers."""
    kinds = set(map(type, items))
    integer = dtype.kind in "iu"
    allowed = {int} if integer else {int, float}
    if not kinds <= allowed:
        wrong = sorted(k.__name__ for k in kinds - allowed)
        raise bad(f"input {name!r}: data holds {' and '.join(wrong)} values, not {datatype}"
                  + (" (integers: send [0, 1] floats as FP32)" if integer and float in kinds else ""))
    try:
        wide = np.asarray(items, dtype=np.int64 if integer else np.float64)
    except OverflowError as err:
        raise bad(f"input {name!r}: data holds an integer out of {datatype}'s range") from err
    if integer:
        info = np.iinfo(dtype)
        if wide.size and (int(wide.min()) < info.min or int(wide.max()) > info.max):
            raise bad(f"input {name!r}: data holds an integer out of {datatype}'s range ({info.min} to {info.max})")
        return wide.astype(dtype)
    if wide.size and not (np.isfinite(wide).all() and float(np.abs(wide).max()) <= float(np.finfo(dtype).max)):
        raise bad(f"input {name!r}: data holds a value that is not a finite {datatype}")
    return wide.astype(dtype)  # in range: the cast rounds, it cannot overflow


def decode_tensor(spec: RequestInput, raw: bytes | None) -> Tensor:
    """One input's elements from its JSON ``data`` or its binary bytes, checked against its shape."""
    tensor = Tensor(spec.name, spec.shape, spec.datatype, spec.parameters)
    count = _count(spec.shape)
    if spec.datatype == "BYTES":
        if raw is not None:
            tensor.items = _split_bytes(raw, spec.name)
        else:
            flat = _flat(spec.data, spec.name)
            odd = [s for s in flat if not isinstance(s, str)][:1]
            if odd:  # str(None) and str(1234) are base64 too: they were decoded and refused as "not an image"
                raise bad(f"input {spec.name!r}: BYTES elements in JSON must be base64 strings, got {json.dumps(odd[0])[:40]}")
            try:
                tensor.items = [base64.b64decode(s, validate=True) for s in flat]
            except (binascii.Error, ValueError) as err:
                raise bad(f"input {spec.name!r}: BYTES elements in JSON must be base64 strings") from err
        got = len(tensor.items)
    elif spec.datatype in DTYPES:
        dtype = DTYPES[spec.datatype]
        if raw is not None:
            if len(raw) % dtype.itemsize:
                raise bad(f"input {spec.name!r}: {len(raw)} bytes of binary data is not a whole number of {spec.datatype}")
            tensor.array = np.frombuffer(raw, dtype=dtype)
        else:
            tensor.array = json_numbers(_flat(spec.data, spec.name), dtype, spec.name, spec.datatype)
        got = tensor.array.size
    else:
        raise bad(f"input {spec.name!r}: datatype {spec.datatype} is not supported; send BYTES, FP32 or UINT8")
    if got != count:
        raise bad(f"input {spec.name!r}: shape {spec.shape} needs {count} elements, the data holds {got}")
    if tensor.array is not None:
        tensor.array = tensor.array.reshape(spec.shape)
    return tensor


def validate_request(given: bytes | dict[str, Any]) -> InferRequest:
    """The inference request of a JSON body (or of the same fields as a dict: the gRPC door's), or a 400 naming what is wrong."""
    try:
        return InferRequest.model_validate_json(given) if isinstance(given, bytes) else InferRequest.model_validate(given)
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(p) for p in e.get("loc", ()))
        raise bad(f"the inference request is not valid: {where + ': ' if where else ''}{e.get('msg')}") from err


LARGE_REQUEST_BYTES = 256 * 1024
"""A request (HTTP body or gRPC message) of this size or more is read off the event loop, in an image thread: a body of
10 MB of JSON numbers took the loop 1-4 s (the health probes and every other request waited), and an image's request of
a few kB takes less than the thread's hand-over."""


@dataclass(frozen=True)
class BatchLimits:
    """What a request's inputs may hold, known before any of their data is read: ``images`` (IDG_MAX_BATCH_FILES) in the
    batch dimension, and at most that many images of ``image_elements`` numbers each (the model's ``3 x S x S``)."""

    images: int
    image_elements: int

    def check(self, request: InferRequest) -> None:
        """413 for a batch of more images than the limit, 400 for a tensor larger than that many images, from the shapes alone."""
        for spec in request.inputs:
            n = spec.shape[0] if spec.shape else 0
            if n > self.images:
                raise ApiError(413, f"a request holds at most {self.images} images (IDG_MAX_BATCH_FILES), this one {n}",
                               code="too_large")
            count = _count(spec.shape)
            if spec.datatype != "BYTES" and count > max(n, 1) * self.image_elements:
                raise bad(f"input {spec.name!r}: its shape {spec.shape} holds {count} elements, more than {max(n, 1)} image(s) "
                          f"of {self.image_elements}")


def read_infer_request(body: bytes, header_length: str | None, limits: BatchLimits) -> tuple[InferRequest, list[Tensor]]:
    """The request and its input tensors, from a JSON body or a JSON header followed by binary data; ``limits`` checked
    from the shapes before any tensor's data is decoded."""
    binary = b""
    if header_length is not None:
        if not (header_length.isascii() and header_length.isdigit()) or int(header_length) > len(body):
            raise bad(f"Inference-Header-Content-Length {header_length!r} is not a length within the body's {len(body)} bytes")
        body, binary = body[:int(header_length)], body[int(header_length):]
    request = validate_request(body)
    limits.check(request)
    tensors, pos = [], 0
    for spec in request.inputs:
        raw = None
        if "binary_data_size" in spec.parameters:
            size = spec.parameters["binary_data_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or pos + size > len(binary):
                raise bad(f"input {spec.name!r}: binary_data_size {size!r} is beyond the {len(binary) - pos} binary bytes left")
            raw, pos = binary[pos:pos + size], pos + size
        elif spec.data is None:
            raise bad(f"input {spec.name!r} has neither data nor binary_data_size")
        tensors.append(decode_tensor(spec, raw))
    if pos != len(binary):
        raise bad(f"the body has {len(binary) - pos} binary bytes that no input's binary_data_size claims")
    return request, tensors


@dataclass
class Output:
    """One output tensor of the answer."""

    name: str
    array: np.ndarray[Any, Any] | None = None
    items: list[bytes] = field(default_factory=list)
    shape: list[int] = field(default_factory=list)
    parameters: dict[str, Scalar] = field(default_factory=dict)

    @property
    def dims(self) -> list[int]:
        return list(self.array.shape) if self.array is not None else self.shape

    @property
    def datatype(self) -> str:
        if self.array is None:
            return "BYTES"
        return next(k for k, v in DTYPES.items() if v == self.array.dtype.newbyteorder("<"))

    def binary(self) -> bytes:
        if self.array is not None:
            return np.ascontiguousarray(self.array, dtype=self.array.dtype.newbyteorder("<")).tobytes()
        return b"".join(struct.pack("<I", len(s)) + s for s in self.items)

    def json_data(self) -> list[Any]:
        if self.array is not None:
            return list(self.array.ravel().tolist())
        return [s.decode("utf-8") for s in self.items]

    def json_pieces(self) -> Iterator[bytes]:
        """:meth:`json_data` as JSON text (``[...]``, the same bytes as ``json.dumps``), :data:`JSON_SLICE` values a piece."""
        count = self.array.size if self.array is not None else len(self.items)
        if count == 0:
            yield b"[]"
            return
        flat = self.array.ravel() if self.array is not None else None
        for start in range(0, count, JSON_SLICE):
            end = start + JSON_SLICE
            values = flat[start:end].tolist() if flat is not None else [s.decode("utf-8") for s in self.items[start:end]]
            text = json.dumps(values, separators=(",", ":"))[1:-1]
            yield (("[" if start == 0 else ",") + text + ("]" if end >= count else "")).encode()


JSON_SLICE = 4096
"""Values of an output written at once in a JSON answer (a few milliseconds of formatting floats): a large answer is
written piece by piece (:func:`infer_response_parts`) and the event loop serves other requests between the pieces.
json.dumps of a whole answer, 105 MB for 32 explained images, had held the loop 2-6 s, in a thread too: the C encoder
keeps the GIL throughout."""


def infer_response_parts(model: str, request_id: str | None, outputs: list[tuple[Output, bool]],
                         parameters: dict[str, Scalar]) -> tuple[Iterator[bytes], list[bytes]]:
    """The answer's JSON (its outputs' ``data`` written :data:`JSON_SLICE` values a piece, lazily) and the binary outputs'
    bytes that follow it (``(output, binary)`` pairs)."""
    chunks: list[bytes] = []
    described = []
    in_json: list[Output] = []
    mark = f"\x00{secrets.token_hex(8)}\x00"  # where each JSON output's data goes: a string no answer holds otherwise
    for out, in_binary in outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": out.dims}
        params = dict(out.parameters)
        if in_binary:
            data = out.binary()
            params["binary_data_size"] = len(data)
            chunks.append(data)
        else:
            entry["data"] = mark
            in_json.append(out)
        if params:
            entry["parameters"] = params
        described.append(entry)
    answer: dict[str, Any] = {"model_name": model, "outputs": described}
    request_id = request_id if request_id is not None else current_request_id()  # none given: its X-Request-ID
    if request_id is not None:
        answer["id"] = request_id
    if parameters:
        answer["parameters"] = parameters
    head = json.dumps(answer, separators=(",", ":"))  # NaN (a shorter curve's padding) as NaN, as tritonclient reads it
    return _spliced(head, json.dumps(mark), in_json), chunks


def _spliced(head: str, mark: str, outputs: list[Output]) -> Iterator[bytes]:
    """``head`` with each ``mark`` (in order) replaced by the next output's data, piece by piece."""
    rest = head
    for out in outputs:
        before, rest = rest.split(mark, 1)
        yield before.encode()
        yield from out.json_pieces()
    yield rest.encode()


def write_infer_response(model: str, request_id: str | None, outputs: list[tuple[Output, bool]], parameters: dict[str, Scalar],
                         ) -> tuple[bytes, int | None]:
    """The answer's body at once, and the JSON header's length when some output is in binary (``(output, binary)`` pairs)."""
    pieces, chunks = infer_response_parts(model, request_id, outputs, parameters)
    header = b"".join(pieces)
    return (header + b"".join(chunks), len(header)) if chunks else (header, None)


def is_true(value: Scalar | None) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")

