"""Arrow columns from the point file's numpy arrays, without a Python loop over rows.

Times (seconds as float64 in the file) become int64 nanoseconds: the ranks measure with
`perf_counter_ns`, so nanoseconds lose nothing, and integers compress several times better
than the noisy low bits of a float. Fixed-width byte strings become dictionary-encoded
strings. An absent value (NaN, or -1 for a counter) becomes null. Every column is declared
once, as a `Column`, with its unit and its Parquet encoding; the schemas, the writer's
options and docs/export.md follow from the declarations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NS_PER_S = 1e9
_INT64_LIMIT = 9.2e18  # nanoseconds beyond this (292 years) do not fit an int64: null

Encoding = Literal["dictionary", "delta", "split", "plain"]
STRING = pa.dictionary(pa.int32(), pa.string())

_ENCODING = {"delta": "DELTA_BINARY_PACKED", "split": "BYTE_STREAM_SPLIT", "plain": "PLAIN"}


@dataclass(frozen=True)
class Column:
    """One column of an exported table: name (unit suffix included), Arrow type, unit, what it
    holds, and its Parquet encoding (dictionary for few distinct values, delta for counters and
    clocks, byte-stream split for floats)."""

    name: str
    type: Any  # a pyarrow DataType
    unit: str
    doc: str
    encoding: Encoding = "plain"

    def field(self) -> Any:
        meta = {"unit": self.unit, "description": self.doc} if self.unit else {"description": self.doc}
        return pa.field(self.name, self.type, metadata=meta)


def schema(columns: Sequence[Column]) -> Any:
    return pa.schema([c.field() for c in columns])


def writer_options(columns: Sequence[Column]) -> dict[str, Any]:
    """ParquetWriter keyword arguments: zstd, each column's encoding, and values handed to the
    encoders 64 Ki at a time (a tenth to a quarter faster than 1 Ki, the same bytes)."""
    return {
        "compression": "zstd",
        "write_batch_size": 1 << 16,
        "use_dictionary": [c.name for c in columns if c.encoding == "dictionary"],
        "column_encoding": {c.name: _ENCODING[c.encoding] for c in columns if c.encoding in ("delta", "split")},
    }


def nanoseconds(seconds: np.ndarray) -> Any:
    """Seconds (float) as int64 nanoseconds, rounded to the nearest; NaN or out of range: null."""
    scaled = np.multiply(seconds, NS_PER_S, dtype=np.float64)
    np.rint(scaled, out=scaled)
    if scaled.size == 0 or (scaled.min() > -_INT64_LIMIT and scaled.max() < _INT64_LIMIT):  # NaN fails both
        return pa.array(scaled.astype(np.int64))
    valid = np.abs(scaled) < _INT64_LIMIT  # False for NaN and infinities too
    return pa.array(np.where(valid, scaled, 0).astype(np.int64), mask=~valid)


def counter(values: np.ndarray) -> Any:
    """An integer counter whose absent value is -1 (the sampler's convention): -1 becomes null."""
    ints = np.ascontiguousarray(values, dtype=np.int64)
    absent = ints < 0
    return pa.array(ints, mask=absent if absent.any() else None)


def floats(values: np.ndarray) -> Any:
    """Floats as they are stored (float32 stays float32); NaN becomes null."""
    data = np.ascontiguousarray(values)
    missing = np.isnan(data)
    return pa.array(data, mask=missing if missing.any() else None)


def ints(values: np.ndarray, dtype: type[np.integer[Any]] = np.int32) -> Any:
    return pa.array(np.ascontiguousarray(values, dtype=dtype))


def strings(fixed: np.ndarray) -> Any:
    """Fixed-width byte strings (numpy 'S<n>', NUL-padded) as a dictionary<int32, string> column.

    One value throughout (an op, a dtype) is found by one comparison; otherwise the dictionary
    is built by Arrow's hash over the raw bytes (a sort of ten million names would take
    seconds). Only the few distinct values are decoded in Python."""
    n, width = len(fixed), fixed.dtype.itemsize
    if n == 0:
        return pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
    if (fixed[:: max(1, n // 64)] == fixed[0]).all() and (fixed == fixed[0]).all():  # a sample first: cheap
        indices, values = pa.array(np.zeros(n, dtype=np.int32)), [bytes(fixed[0])]
    else:
        raw = np.ascontiguousarray(fixed).view(np.uint8)
        binary = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(raw)])
        encoded = pc.dictionary_encode(binary)
        indices, values = encoded.indices, encoded.dictionary.to_pylist()
    text = [v.rstrip(b"\0").decode("utf-8", "replace") for v in values]
    return pa.DictionaryArray.from_arrays(indices, pa.array(text, pa.string()))


def constant(value: str, n: int) -> Any:
    """`n` rows of one string (the point id): a dictionary of one value, every index 0."""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([value], pa.string()))


def table(columns: Sequence[Column], arrays: dict[str, Any]) -> Any:
    """A pyarrow Table in the declared column order and schema (field metadata included)."""
    return pa.Table.from_arrays([arrays[c.name] for c in columns], schema=schema(columns))
