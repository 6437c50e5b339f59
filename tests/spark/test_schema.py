from __future__ import annotations

from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType

from spark.schema import CORRUPT_RECORD, backlog_schema, event_schema, with_corrupt_record
from wire import event_schema as ev


def test_event_schema_has_every_field_in_order_with_its_type() -> None:
    schema = event_schema()
    assert schema.names == list(ev.EVENT_FIELDS)
    assert schema[ev.TS].dataType == LongType()
    assert schema[ev.SITE].dataType == IntegerType()
    assert schema[ev.EVENT].dataType == StringType()
    assert all(field.nullable for field in schema.fields)


def test_backlog_schema_has_every_field_with_its_type() -> None:
    schema = backlog_schema()
    assert schema.names == list(ev.BACKLOG_FIELDS)
    assert schema[ev.AGE_S].dataType == DoubleType()
    assert schema[ev.DEADLINE].dataType == LongType()


def test_corrupt_record_column_is_added_last() -> None:
    assert with_corrupt_record(event_schema()).names == [*ev.EVENT_FIELDS, CORRUPT_RECORD]
