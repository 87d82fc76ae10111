"""The cache's entries as plain arrays and JSON (cache.py): no pickled objects.

An entry is one `.npz` file written with `allow_pickle=False` and two members: `blob`, the
bytes of every numeric column one after another, and `meta`, one JSON text with everything
else (rows of scalars, object columns of text, the entry's key) and each column's dtype,
shape and place in the blob (two members, not one per column: reading a zip member costs
more than a small column). A table round-trips with its column order, dtypes and values; rows
of numpy scalars come back as the Python scalars DataFrame construction treats alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

NUMERIC_KINDS = "biufcmM"  # kept as bytes; object and extension columns go through JSON
ALIGN = 16  # each array's bytes start at a multiple of this in the blob


class Encoder:
    """Collects an entry's bytes and JSON-ready description while it is encoded."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The entry's arrays to store beside `meta`: the blob."""
        return {"blob": np.frombuffer(b"".join(self.parts), dtype=np.uint8)}

    def array(self, values: np.ndarray) -> dict[str, Any]:
        """A column or array: by its place in the blob, or as a JSON list of its values."""
        values = np.asarray(values)
        if values.dtype.kind in NUMERIC_KINDS or values.dtype.kind in "US":
            data = np.ascontiguousarray(values).tobytes()
            spec = {"at": self.size, "dtype": values.dtype.str, "shape": list(values.shape)}
            padded = data + b"\0" * (-len(data) % ALIGN)
            self.parts.append(padded)
            self.size += len(padded)
            return spec
        if values.dtype.kind != "O" or values.ndim != 1:
            raise TypeError(f"cannot cache an array of dtype {values.dtype} and {values.ndim} dimensions")
        return {"json": [plain(v) for v in values.tolist()]}

    def columns(self, table: dict[str, np.ndarray]) -> list[Any]:
        return [[name, self.array(values)] for name, values in table.items()]

    def frame(self, frame: pd.DataFrame) -> dict[str, Any]:
        if not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0 or frame.index.step != 1:
            raise TypeError("cannot cache a table indexed other than 0, 1, 2, ...")
        columns = []
        for name in frame.columns:
            if not isinstance(name, str):
                raise TypeError(f"cannot cache a column named {name!r}")
            column = frame[name]
            dtype = column.dtype
            if isinstance(dtype, np.dtype) and dtype.kind in NUMERIC_KINDS:
                columns.append([name, str(dtype), self.array(column.to_numpy())])
            else:
                values = column.to_numpy(dtype=object)
                columns.append([name, str(dtype), {"json": [plain(v) for v in values.tolist()]}])
        return {"rows": len(frame), "columns": columns}


class Decoder:
    """Reads an entry's parts back from its blob and its JSON."""

    def __init__(self, blob: np.ndarray) -> None:
        self.blob = blob

    def array(self, spec: dict[str, Any]) -> np.ndarray:
        if "at" in spec:
            dtype, shape = np.dtype(spec["dtype"]), tuple(int(n) for n in spec["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            flat = np.frombuffer(self.blob, dtype=dtype, count=count, offset=int(spec["at"]))
            out: np.ndarray = flat.reshape(shape).copy()  # writable, and not holding the blob
            return out
        return objects(spec["json"])

    def columns(self, spec: list[Any]) -> dict[str, np.ndarray]:
        return {str(name): self.array(values) for name, values in spec}

    def frame(self, spec: dict[str, Any]) -> pd.DataFrame:
        data: dict[str, Any] = {}
        dtypes: dict[str, str] = {}
        for name, dtype, values in spec["columns"]:
            data[name] = self.array(values)
            dtypes[name] = dtype
        if not data:
            return pd.DataFrame(index=pd.RangeIndex(int(spec["rows"])))
        frame = pd.DataFrame(data, index=pd.RangeIndex(int(spec["rows"])), columns=list(data))
        for name, dtype in dtypes.items():
            if str(frame[name].dtype) != dtype:
                frame[name] = frame[name].astype(pd.api.types.pandas_dtype(dtype))
        return frame


def objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def plain(value: Any) -> Any:
    """A JSON-ready scalar (numpy scalars as Python's); refuses what JSON would change."""
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Path):
        raise TypeError("cannot cache a path object")  # it would come back as text
    raise TypeError(f"cannot cache a value of type {type(value).__name__}")


def row(values: dict[str, object]) -> dict[str, Any]:
    return {str(k): plain(v) for k, v in values.items()}


def dumps(meta: dict[str, Any]) -> str:
    return json.dumps(meta, allow_nan=True, separators=(",", ":"))


def loads(text: str) -> dict[str, Any]:
    meta = json.loads(text)
    if not isinstance(meta, dict):
        raise ValueError("an entry's description is not a mapping")
    return meta
