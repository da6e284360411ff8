"""The ``kestrel`` source's options (no Spark session needed)."""

from __future__ import annotations

import pytest

from kestrel_actors.spark_bridge._source import SourceOptions


def test_defaults_and_connections_per_server():
    options = SourceOptions.parse({"queue": "q"})
    assert (options.max_items_per_batch, options.items_per_connection,
            options.items_per_partition, options.read_ahead) == (50_000, 10_000, 12_500, True)
    assert options.connections_per_server == 5
    custom = SourceOptions.parse({"queue": "q", "maxItemsPerBatch": "250",
                                  "ITEMSPERCONNECTION": "100", "readAhead": "False"})
    assert (custom.connections_per_server, custom.read_ahead) == (3, False)


@pytest.mark.parametrize("options", [{"queue": "q", "readAhead": "yes"},
                                     {"queue": "q", "itemsPerConnection": "0"}])
def test_bad_values_are_refused(options):
    with pytest.raises(ValueError, match="kestrel"):
        SourceOptions.parse(options)
