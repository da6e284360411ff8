"""The speed bench's references for the ``kestrel`` source (issue 22 point 6,
``kestrel_actors.loadtests.spark_source_bench``): ``python-ceiling``, a Python streaming
source that reads nothing, and Spark's ``rate-micro-batch`` run through the same query and give
the figures the bench compares against."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_python_ceiling_streams_its_rows_and_the_bench_reads_its_figures(spark, tmp_path):
    from kestrel_actors.loadtests._ceiling_source import CeilingSource
    from kestrel_actors.loadtests.spark_source_bench import _jit_per_second, _python_ceiling
    from kestrel_actors.spark_bridge._source import SCHEMA

    # like for like: the ceiling yields the kestrel source's columns and types (issue 57.4)
    assert CeilingSource({}).schema() == SCHEMA

    spark.dataSource.register(CeilingSource)
    figures = _python_ceiling(spark, 200, 50, 600, 16, str(tmp_path / "ceiling"))
    assert figures.rows >= 600 and 0 < figures.first_rows <= figures.seconds
    assert figures.steady is not None and figures.steady > 0  # three batches or more after the first
    # the Spark JVM and the Python workers that ran ``read`` are found and their CPU counted
    assert figures.cpu_us["spark-jvm"] > 0 and figures.cpu_us["python-workers"] > 0
    assert figures.cpu_us["all"] >= figures.cpu_us["spark-jvm"] + figures.cpu_us["python-workers"]
    # the JVM's JIT compiler threads are counted apart from the rest of the JVM (issue 57.4)
    assert "spark-jvm-jit" in figures.cpu_us and figures.cpu_us["spark-jvm-jit"] >= 0
    assert figures.cpu_us["all"] >= figures.cpu_us["spark-jvm"] + figures.cpu_us["spark-jvm-jit"]
    # and per second of the query: it tracks the query's duration more than its rows
    assert _jit_per_second(figures) >= 0

    rows = (spark.readStream.format("python-ceiling").option("rowsPerBatch", 7)
            .option("rowsPerPartition", 3).option("itemBytes", 5).load()
            .writeStream.format("memory").queryName("ceiling_rows")
            .option("checkpointLocation", str(tmp_path / "memory")).trigger(once=True).start())
    rows.awaitTermination(120)
    table = spark.sql("select value, queue, server, timestamp from ceiling_rows").collect()
    assert len(table) == 7 and {bytes(r.value) for r in table} == {b"xxxxx"}
    assert all(r.queue == "q" and r.server == "s" and r.timestamp is not None for r in table)


def test_python_ceiling_plans_no_rows_past_its_total():
    """With ``rows`` the ceiling, like the drained ``kestrel`` query, plans no micro-batch past
    the rows the bench counts, so the bench stops it with no task running: Spark kills the
    Python worker of a task it interrupts, and the next query would pay for new workers."""
    from kestrel_actors.loadtests._ceiling_source import CeilingSource

    reader = CeilingSource({"rowsPerBatch": "7", "rowsPerPartition": "3", "itemBytes": "5",
                            "rows": "14"}).streamReader(None)
    first = reader.latestOffset(reader.initialOffset())
    second = reader.latestOffset(first)
    assert [p.count for p in reader.partitions(reader.initialOffset(), second)] == [3, 3, 3, 3, 2]
    assert reader.latestOffset(second) == second  # 14 rows planned: nothing more
    endless = CeilingSource({"rowsPerBatch": "7"}).streamReader(None)
    assert endless.latestOffset({"seq": 1000}) == {"seq": 1001}


def test_the_ceiling_run_on_both_sides_of_ours_counts_as_the_mean_of_its_runs():
    """The JIT works less with each query of the reported round, so the ceiling runs just
    before and just after ``kestrel`` and each of its figures is the mean of the two."""
    from kestrel_actors.loadtests.spark_source_bench import QueryFigures, _either_side

    before = QueryFigures(100, 2.0, 0.5, 80.0, {"spark-jvm-jit": 4.0, "all": 10.0}, [],
                          planner={"minor_faults": 0.1, "threads_us": {"main": 2.0}})
    after = QueryFigures(100, 1.0, 0.25, 120.0, {"spark-jvm-jit": 2.0, "all": 8.0}, [],
                         planner={"minor_faults": 0.3, "threads_us": {"main": 1.0}})
    both = _either_side(before, after)
    assert (both.rows, both.seconds, both.first_rows, both.steady) == (100, 1.5, 0.375, 100.0)
    assert both.cpu_us == {"spark-jvm-jit": 3.0, "all": 9.0}
    assert both.planner == {"minor_faults": 0.2, "threads_us": {"main": 1.5}}
