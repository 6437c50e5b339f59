"""Spark schemas of the event log and the backlog snapshot, built from ``wire.event_schema``.

The JSON is always read with these schemas, never inferred: inference reads the data twice and turns a
field that happens to be absent from a whole file into a missing column.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql.types import (
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from wire import event_schema as ev

# The column Spark fills with the raw text of a line it could not parse against the schema.
CORRUPT_RECORD: Final = "_corrupt_record"

_TYPES: Final[dict[str, DataType]] = {
    "long": LongType(),
    "int": IntegerType(),
    "string": StringType(),
    "double": DoubleType(),
}


def struct_of(fields: dict[str, str]) -> StructType:
    """A nullable StructType with the given ``name -> type name`` fields, in their order."""
    return StructType(
        [StructField(name, _TYPES[type_name], nullable=True) for name, type_name in fields.items()]
    )


def event_schema() -> StructType:
    """The schema of one event line."""
    return struct_of(ev.EVENT_FIELDS)


def backlog_schema() -> StructType:
    """The schema of one backlog snapshot line."""
    return struct_of(ev.BACKLOG_FIELDS)


def with_corrupt_record(schema: StructType) -> StructType:
    """``schema`` plus the column that keeps the text of lines that are not valid for it."""
    return StructType([*schema.fields, StructField(CORRUPT_RECORD, StringType(), nullable=True)])
