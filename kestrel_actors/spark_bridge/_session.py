"""Create the bridge's SparkSession with settings that work on one small, offline machine.

Why these defaults: the Python workers must run this interpreter (it has the bridge and the
user's jobs installed), the driver must bind to loopback (no other interface may exist or be
reachable), the UI is useless for a headless bridge, and a batch is small so shuffles need few
partitions and the driver little memory. Every default can be overridden with ``--conf``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["create_spark_session", "spark_defaults", "prepare_spark_env"]


def spark_defaults(partitions: int = 4) -> dict[str, str]:
    """The bridge's Spark settings before the user's ``--conf`` is applied."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "768m",
        "spark.sql.shuffle.partitions": str(max(1, partitions)),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }


def prepare_spark_env(conf: Mapping[str, str]) -> None:
    """Environment the JVM launcher and the Python workers read (before the JVM starts)."""
    python = conf.get("spark.pyspark.python", sys.executable)
    os.environ["PYSPARK_PYTHON"] = python
    os.environ["PYSPARK_DRIVER_PYTHON"] = conf.get("spark.pyspark.driver.python", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", conf.get("spark.driver.bindAddress", "127.0.0.1"))


def create_spark_session(master: str = "local[*]", conf: Mapping[str, str] | None = None,
                         app_name: str = "kestrel-bridge", partitions: int = 4) -> SparkSession:
    """Start (or join) the process's SparkSession; takes 5–9 s the first time."""
    settings = spark_defaults(partitions)
    settings.update(conf or {})
    prepare_spark_env(settings)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.get("spark.log.level", "WARN"))
    _quiet_task_size_warning(spark)
    return spark


def _quiet_task_size_warning(spark: SparkSession) -> None:
    """``parallelize`` ships a batch inside its tasks (10,000 items of 1 KiB is ~2.5 MiB per
    task with 4 partitions), which makes TaskSetManager warn on every batch. That is expected
    here, so raise that one logger to ERROR (best effort: log4j2's API may be absent)."""
    try:
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.scheduler.TaskSetManager", jvm.org.apache.logging.log4j.Level.ERROR)
    except Exception:  # noqa: BLE001 - purely cosmetic
        pass
