"""Which serialization the process runtime's messages use: `python -m benchmarks.diagnostics.wireformat [OUT.json]`.

Measures, for the messages one decode step sends (a `prepare_batch` plan of B one-token
items and the `execute_batch` completion coming back), the host time of encoding and
decoding each with

- **pickle** (protocol 5) of the protocol's frozen attrs values as they are;
- **msgspec** (MessagePack) of the same values turned into tagged lists and back, which is
  what msgspec needs for them: it encodes attrs classes but cannot decode the protocol's
  unions of attrs classes (an `Intent`, a reply that is any of several values) without a
  tag, so a tagged form is built and read by a Python walk (and its lists made tuples again);
- **flat pickle**: each record a list `[class index, fields...]` (a Python walk), tuples
  kept, pickled; rebuilt by a walk calling each record's constructor;
- **table pickle**, the process runtime's form (`cacheruntime.runtime.process.wire`): pickle
  with a dispatch table that reduces each record to its constructor and field values, so
  pickle's own loop saves and rebuilds them.

Prints one row per batch size B and message, with bytes and microseconds per round trip
(median of repeats); docs/process-runtime.md quotes the figures and the choice.
"""

from __future__ import annotations

import json
import pickle
import statistics
import sys
import time
from typing import Any

import attrs
import msgspec

from cacheruntime import protocol
from cacheruntime.protocol import BatchCompletion, BatchItem, BatchPlan, ItemResult, PreparedBatchHandle, RequestRuntimeHandle
from cacheruntime.runtime.process import wire

BATCH_SIZES = (1, 16, 64, 256)
REPEATS = 7
LOOPS = 200

_RECORDS = sorted((c for c in vars(protocol).values() if isinstance(c, type) and attrs.has(c)), key=lambda c: c.__name__)
_INDEX = {cls: i for i, cls in enumerate(_RECORDS)}
_TYPES = {cls.__name__: cls for cls in vars(protocol).values() if isinstance(cls, type) and attrs.has(cls)}
_ENUMS = {cls.__name__: cls for cls in vars(protocol).values() if isinstance(cls, type) and issubclass(cls, protocol.enum.Enum)}


def to_tagged(value: Any) -> Any:
    """A protocol value as msgpack-able lists: [type name, field values...], enums as [name, value]."""
    if isinstance(value, tuple):
        return [to_tagged(v) for v in value]
    if isinstance(value, protocol.enum.Enum):
        return ["!" + type(value).__name__, value.value]
    if attrs.has(type(value)):
        return [type(value).__name__, *(to_tagged(getattr(value, f.name)) for f in attrs.fields(type(value)))]
    return value


def from_tagged(value: Any) -> Any:
    """The inverse of `to_tagged` (lists become tuples)."""
    if isinstance(value, list):
        if value and isinstance(value[0], str) and value[0] in _TYPES:
            return _TYPES[value[0]](*(from_tagged(v) for v in value[1:]))
        if value and isinstance(value[0], str) and value[0].startswith("!"):
            return _ENUMS[value[0][1:]](value[1])
        return tuple(from_tagged(v) for v in value)
    return value


def flatten(value: Any) -> Any:
    """Every record as `[class index, flattened fields...]`; tuples of records walked, plain tuples kept."""
    if attrs.has(type(value)):
        return [_INDEX[type(value)], *(flatten(getattr(value, f.name)) for f in attrs.fields(type(value)))]
    if type(value) is tuple and value and not isinstance(value[0], (int, str)):
        return tuple(flatten(v) for v in value)
    return value


def rebuild(value: Any) -> Any:
    """The inverse of `flatten` (keyword-only fields by name)."""
    if type(value) is list:
        cls = _RECORDS[value[0]]
        fields = attrs.fields(cls)
        args = [rebuild(v) for v in value[1:]]
        return cls(**{f.name: a for f, a in zip(fields, args)})
    if type(value) is tuple and value and not isinstance(value[0], (int, str)):
        return tuple(rebuild(v) for v in value)
    return value


def messages(batch: int) -> dict[str, Any]:
    """One decode step's request and reply at batch size `batch`."""
    handles = [RequestRuntimeHandle("local", 0, slot, 3) for slot in range(batch)]
    plan = BatchPlan(tuple(BatchItem(h, (), (), True) for h in handles))
    prepared = PreparedBatchHandle("local", 0, 17)
    done = BatchCompletion(prepared, tuple(ItemResult(h, 1000, 31337) for h in handles), (), ())
    return {"prepare_batch request": ("prepare_batch", plan), "execute_batch reply": (wire.OK, done)}


def _time(round_trip) -> float:
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(LOOPS):
            round_trip()
        samples.append((time.perf_counter() - start) / LOOPS)
    return statistics.median(samples) * 1e6


def main(argv: list[str]) -> int:
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    rows = []
    for batch in BATCH_SIZES:
        for name, message in messages(batch).items():
            pickled = pickle.dumps(message, protocol=5)
            packed = encoder.encode(to_tagged(message))
            flat = pickle.dumps(tuple(flatten(part) for part in message), protocol=5)
            table = wire.dumps(message)
            assert pickle.loads(pickled) == message and from_tagged(decoder.decode(packed)) == message
            assert tuple(rebuild(part) for part in pickle.loads(flat)) == message and wire.loads(table) == message
            rows.append(
                {
                    "B": batch,
                    "message": name,
                    "pickle_bytes": len(pickled),
                    "pickle_us": _time(lambda m=message: pickle.loads(pickle.dumps(m, protocol=5))),
                    "msgspec_bytes": len(packed),
                    "msgspec_us": _time(lambda m=message: from_tagged(decoder.decode(encoder.encode(to_tagged(m))))),
                    "flat_bytes": len(flat),
                    "flat_us": _time(lambda m=message: tuple(rebuild(p) for p in pickle.loads(pickle.dumps(tuple(flatten(p) for p in m), protocol=5)))),
                    "table_bytes": len(table),
                    "table_us": _time(lambda m=message: wire.loads(wire.dumps(m))),
                }
            )
    print(
        f"{'B':>4} {'message':24} {'pickle B':>9} {'pickle us':>10} {'msgspec B':>10} {'msgspec us':>11} {'flat B':>7} {'flat us':>8} {'table B':>8} {'table us':>9}"
    )
    for r in rows:
        print(
            f"{r['B']:>4} {r['message']:24} {r['pickle_bytes']:>9} {r['pickle_us']:>10.1f} {r['msgspec_bytes']:>10} {r['msgspec_us']:>11.1f}"
            f" {r['flat_bytes']:>7} {r['flat_us']:>8.1f} {r['table_bytes']:>8} {r['table_us']:>9.1f}"
        )
    if len(argv) > 1:
        with open(argv[1], "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
