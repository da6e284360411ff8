"""The bridge's SparkSession: settings that work on one small, offline machine, and the
shipping of job code to the executors.

Why these defaults: the Python workers must run this interpreter (it has the bridge and the
user's jobs installed), the driver must bind to loopback (no other interface may exist or be
reachable), the UI is useless for a headless bridge, and a batch is small so shuffles need few
partitions and the driver little memory. Every default can be overridden with ``--conf``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._config import job_module_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["create_spark_session", "prepare_spark_env", "ship_job_code", "spark_defaults"]


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
        if jvm is None:  # not started: nothing logs yet
            return
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.scheduler.TaskSetManager", jvm.org.apache.logging.log4j.Level.ERROR)
    except Exception:  # noqa: BLE001 - purely cosmetic
        pass


def ship_job_code(spark: SparkSession, job: str | Callable[..., Any],
                  py_files: Iterable[str] = ()) -> list[str]:
    """Make the job importable on every executor; returns what was shipped.

    Spark pickles a job's functions *by reference* when their module is importable on the
    driver, so an executor must import that module too — on a cluster it usually cannot, and a
    module-level helper then fails with ``ModuleNotFoundError``. ``py_files`` (``--py-files``:
    ``.py``, ``.zip`` or ``.egg``) are added as they are; the job's own top-level module or
    package is added too unless it is installed (site-packages, the standard library) or is
    this project (which must be installed wherever executors run the bridge's jobs): a module
    file as it is, a package zipped.
    """
    sc = spark.sparkContext
    shipped: list[str] = []
    for path in py_files:
        sc.addPyFile(path)
        shipped.append(path)
    top = job_module_name(job).split(".")[0]
    module = sys.modules.get(top)
    origin = getattr(module, "__file__", None)
    if top in ("", "__main__", "kestrel_actors") or not origin or _installed(origin):
        return shipped
    if hasattr(module, "__path__"):  # a package: ship the whole directory as a zip
        archive = _zip_package(Path(origin).parent, top)
        sc.addPyFile(str(archive))
        shipped.append(str(archive))
    elif origin.endswith(".py"):
        sc.addPyFile(origin)
        shipped.append(origin)
    return shipped


def _installed(path: str) -> bool:
    resolved = Path(path).resolve()
    paths = sysconfig.get_paths()
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        root = paths.get(key)
        if root and resolved.is_relative_to(Path(root).resolve()):
            return True
    return False


def _zip_package(directory: Path, name: str) -> Path:
    """``<tmp>/<name>-<digest>.zip`` holding ``name/**.py``.

    Spark refuses a second, different file under a name it has already shipped ("exists and
    does not match contents"), which a second bridge run in the same SparkSession hits when the
    package changed in between. The archive's name does not matter to the import (the zip is
    a path entry, ``name/`` inside it is the package), so the name carries a digest of the
    contents: the same package ships under the same name, a changed one under a new one.
    """
    files = [f for f in sorted(directory.rglob("*.py")) if "__pycache__" not in f.parts]
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(directory)).encode() + b"\0" + file.read_bytes())
    archive = (Path(tempfile.mkdtemp(prefix="kestrel-job-"))
               / f"{name}-{digest.hexdigest()[:16]}.zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in files:
            zf.write(file, Path(name) / file.relative_to(directory))
    return archive
