"""Built-in bridge jobs. Each is ``job(rdd_of_bytes, meta)``, like a user's job.

Parameters come from ``--job-arg key=value`` (``meta.args``, always strings). What a job
returns decides what the bridge writes (see ``_output``): an RDD or DataFrame of rows, a list
of rows, or ``None`` when the job made its own output durable. Rows are dicts here so that
queue output is self-describing JSON and path output gets named columns.

* ``word_count`` — items are UTF-8 text; rows ``{"word", "count"}``. Args: ``lower=true``.
* ``json_field_sum`` — items are JSON objects; sums a numeric field, optionally per group.
  Args: ``field=a.b`` (required), ``group_by=c.d``.
* ``count`` — one row ``{"items": n}``: the cheapest real job (used by the benchmark).
* ``identity`` — every item as text, ``{"value": str}`` for a path, the bytes for a queue.
"""

from __future__ import annotations

import json
import operator
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import RDD

    from ._meta import BatchMeta

__all__ = ["count", "identity", "json_field_sum", "word_count"]

_TRUE = {"1", "true", "yes", "on"}


def word_count(rdd: RDD, meta: BatchMeta) -> RDD:
    """Count whitespace-separated words over all items of the batch."""
    lower = str(meta.args.get("lower", "")).lower() in _TRUE
    return (
        rdd.flatMap(partial(_words, lower))
        .map(_one)
        .reduceByKey(operator.add)
        .map(_word_row)
    )


def _words(lower: bool, data: bytes) -> list[str]:
    text = data.decode("utf-8", errors="replace")
    return (text.lower() if lower else text).split()


def _one(word: str) -> tuple[str, int]:
    return word, 1


def _word_row(pair: tuple[str, int]) -> dict[str, Any]:
    return {"word": pair[0], "count": pair[1]}


def json_field_sum(rdd: RDD, meta: BatchMeta) -> list[dict[str, Any]]:
    """Sum the numeric ``field`` of JSON-object items, per ``group_by`` value if given.

    Items that are not JSON objects or whose field is missing or not a number are counted in
    ``skipped``. ``sum`` is an integer when every summed value was one, else a float, the same
    for every row so Parquet gets one column type. The aggregated rows are few, so they are
    collected and returned as a list.
    """
    field = meta.args.get("field")
    if not field:
        raise ValueError("json_field_sum needs --job-arg field=<name or a.b.path>")
    group_by = meta.args.get("group_by") or None
    totals = (
        rdd.map(partial(_field_entry, field.split("."), group_by.split(".") if group_by else None))
        .reduceByKey(_merge)
        .collect()
    )
    as_float = any(entry[3] for _, entry in totals)
    rows = []
    for group, (total, counted, skipped, _is_float) in sorted(totals):
        row: dict[str, Any] = {"field": field}
        if group_by:
            row["group"] = group
        row.update(sum=float(total) if as_float else int(total), count=counted, skipped=skipped)
        rows.append(row)
    if not rows and not group_by:
        rows.append({"field": field, "sum": 0, "count": 0, "skipped": 0})
    return rows


def _lookup(obj: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _field_entry(path: list[str], group_path: list[str] | None,
                 data: bytes) -> tuple[str, tuple[float, int, int, bool]]:
    try:
        obj = json.loads(data)
    except ValueError:
        return "", (0, 0, 1, False)
    group = ""
    if group_path is not None:
        value = _lookup(obj, group_path)
        group = value if isinstance(value, str) else ("" if value is None else json.dumps(value))
    number = _lookup(obj, path)
    if isinstance(number, bool) or not isinstance(number, int | float):
        return group, (0, 0, 1, False)
    return group, (number, 1, 0, isinstance(number, float))


def _merge(a: tuple[float, int, int, bool], b: tuple[float, int, int, bool]) -> tuple:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] or b[3]


def count(rdd: RDD, meta: BatchMeta) -> list[dict[str, int]]:
    """One row with the number of items (forces one pass over the batch)."""
    return [{"items": rdd.count()}]


def identity(rdd: RDD, meta: BatchMeta) -> RDD:
    """Pass items through as text (UTF-8, undecodable bytes replaced)."""
    return rdd.map(_as_text)


def _as_text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
