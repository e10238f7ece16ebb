#!/usr/bin/env python3
"""Convert a parquet prompt file (verl's layout) to the JSONL grpo-worker reads.

    parquet_to_jsonl.py IN.parquet OUT.jsonl

One JSON object per row, every column kept: structs become objects, lists
arrays, maps objects (lists of [key, value] pairs when a key is not a string),
dates and times ISO text, decimals numbers, binary values UTF-8 text (anything
else is refused). OUT is written to a temporary file beside it and renamed, so
it is whole or absent. grpo-worker runs this once per parquet file and caches
the result (docs/rewards.md); it needs pyarrow: scripts/parquet_env.sh.

Prints "N rows" on success. Exit status: 0; 2 for bad input (unreadable or
corrupt file, no `prompt` or `messages` column, a value JSON cannot hold); 3
when pyarrow cannot be imported (scripts/parquet_env.sh makes a venv with it).
An error is one line on stderr, "IN.parquet: what is wrong", which the worker
quotes. NaN and infinite floats become null (JSON has neither).

The worker's cache key does not cover this file: when its output changes, bump
PARQUET_CONVERTER_VERSION in worker/data/dataset.c so old copies are not reused.
"""
import datetime
import decimal
import json
import math
import os
import sys
import tempfile

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class BadValue(Exception):
    pass


def plain(v, where):
    """v (from pyarrow's to_pylist, or a numpy/pyarrow scalar) as a value json.dumps writes as strict JSON."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        # the loader's JSON parser holds 64-bit integers; a larger one keeps its digits as text
        return v if INT64_MIN <= v <= INT64_MAX else str(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else None  # JSON has no NaN or infinity
    if isinstance(v, dict):
        return {str(k): plain(x, f"{where}.{k}") for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(p, tuple) and len(p) == 2 for p in v):
            # a map column: pyarrow gives (key, value) pairs
            keys = [p[0] for p in v]
            if all(isinstance(k, str) for k in keys) and len(set(keys)) == len(keys):
                return {k: plain(x, f"{where}.{k}") for k, x in v}
            return [[plain(k, f"{where}[{i}]"), plain(x, f"{where}[{i}]")] for i, (k, x) in enumerate(v)]
        return [plain(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, (bytes, bytearray, memoryview)):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            raise BadValue(f"{where}: binary value is not UTF-8 text") from None
    if isinstance(v, decimal.Decimal):
        if not v.is_finite():
            return None
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if hasattr(v, "as_py"):  # a pyarrow scalar
        return plain(v.as_py(), where)
    if hasattr(v, "tolist"):  # a numpy scalar or array
        return plain(v.tolist(), where)
    raise BadValue(f"{where}: a {type(v).__name__} value has no JSON form")


class Failed(Exception):
    """A reading or writing error, with what was being done."""


def convert(src, dst):
    """Write dst from src; returns the number of rows. Raises BadValue, Failed or pyarrow errors."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(src)
    except OSError as e:  # missing, unreadable (a corrupt file is pyarrow's ArrowInvalid, not an OSError)
        raise Failed(f"cannot read: {e.strerror or e}") from None
    names = pf.schema_arrow.names
    if "prompt" not in names and "messages" not in names:
        cols = ", ".join(names) if names else "none"
        raise BadValue(f"no 'prompt' or 'messages' column; its columns: {cols}")
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(dst)), prefix="." + os.path.basename(dst) + ".",
                                   suffix=".tmp")
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it 0600: give OUT the mode any new file gets
    except OSError as e:
        raise Failed(f"cannot write {dst}: {e.strerror or e}") from None
    rows = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for batch in pf.iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    rows += 1
                    obj = {k: plain(v, f"row {rows}: {k}") for k, v in row.items()}
                    # ASCII with \u escapes: no encoding error is possible, and the loader decodes them
                    f.write(json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":")))
                    f.write("\n")
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as e:
                raise Failed(f"cannot write {dst}: {e.strerror or e}") from None
        try:
            os.replace(tmp, dst)
        except OSError as e:
            raise Failed(f"cannot write {dst}: {e.strerror or e}") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return rows


def main(argv):
    if len(argv) != 3:
        print("usage: parquet_to_jsonl.py IN.parquet OUT.jsonl", file=sys.stderr)
        return 2
    src, dst = argv[1], argv[2]
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        print(f"{src}: cannot import pyarrow with {sys.executable} ({e})", file=sys.stderr)
        return 3
    try:
        rows = convert(src, dst)
    except (BadValue, Failed) as e:
        print(f"{src}: {e}", file=sys.stderr)
        return 2
    except pyarrow.ArrowException as e:
        # corrupt, truncated or not parquet at all: pyarrow's first line says which
        text = str(e).strip()
        print(f"{src}: not a readable parquet file: {text.splitlines()[0] if text else type(e).__name__}",
              file=sys.stderr)
        return 2
    except MemoryError:
        print(f"{src}: out of memory while converting", file=sys.stderr)
        return 2
    except Exception as e:  # one line, never a traceback: the worker shows this line as the reason
        text = str(e).strip()
        print(f"{src}: cannot convert: {type(e).__name__}: {text.splitlines()[0] if text else ''}", file=sys.stderr)
        return 2
    print(f"{rows} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
