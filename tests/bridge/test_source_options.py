"""The ``kestrel`` source's and sink's options (no Spark session needed)."""

from __future__ import annotations

import pytest

from kestrel_actors.spark_bridge._source import SourceOptions


def test_defaults_and_connections_per_server():
    options = SourceOptions.parse({"queue": "q"})
    assert (options.max_items_per_batch, options.items_per_connection,
            options.items_per_partition, options.read_ahead) == (50_000, 10_000, 12_500, True)
    assert (options.max_items_per_trigger, options.min_partitions, options.wal_location,
            options.column) == (None, 1, None, "value")
    assert options.connections_per_server == 5
    custom = SourceOptions.parse({"queue": "q", "maxItemsPerBatch": "250",
                                  "ITEMSPERCONNECTION": "100", "readAhead": "False",
                                  "maxItemsPerTrigger": "700", "minPartitions": "6",
                                  "walLocation": "/ckpt/kestrel-wal"})
    assert (custom.connections_per_server, custom.read_ahead) == (3, False)
    assert (custom.max_items_per_trigger, custom.min_partitions,
            custom.wal_location) == (700, 6, "/ckpt/kestrel-wal")


@pytest.mark.parametrize("options", [{"queue": "q", "readAhead": "yes"},
                                     {"queue": "q", "itemsPerConnection": "0"},
                                     {"queue": "q", "maxItemsPerTrigger": "-1"},
                                     {"queue": "q", "minPartitions": "two"}])
def test_bad_values_are_refused(options):
    with pytest.raises(ValueError, match="kestrel"):
        SourceOptions.parse(options)


@pytest.mark.parametrize("name", ["maxItemPerBatch", "maxitemsperbatches", "bootstrapServers",
                                  "minPartition"])
def test_an_unknown_or_misspelled_option_lists_the_valid_ones(name):
    with pytest.raises(ValueError) as refused:
        SourceOptions.parse({"queue": "q", name: "5"})
    message = str(refused.value)
    assert f"unknown option {name.lower()!r}" in message.lower()
    for valid in ("servers", "queue", "walLocation", "maxItemsPerTrigger", "maxItemsPerBatch",
                  "minPartitions"):
        assert valid in message


@pytest.mark.parametrize("name, why", [
    ("startingOffsets", "no offsets to start from"),
    ("failOnDataLoss", "never drops items"),
    ("maxOffsetsPerTrigger", "use maxItemsPerTrigger"),
    ("endingOffsets", "availableNow"),
])
def test_kafka_only_options_say_why_a_queue_cannot_offer_them(name, why):
    with pytest.raises(ValueError, match=f"(?i)option '{name}' is Kafka's.*{why}"):
        SourceOptions.parse({"queue": "q", name: "x"})


def test_the_sink_takes_its_own_options_and_spark_s():
    sink = SourceOptions.parse({"queue": "q", "column": "line", "path": "/x",
                                "checkpointLocation": "/c"}, sink=True)
    assert sink.column == "line"
    with pytest.raises(ValueError, match=r"(?i)unknown option 'maxitemspertrigger'.*column"):
        SourceOptions.parse({"queue": "q", "maxItemsPerTrigger": "5"}, sink=True)
