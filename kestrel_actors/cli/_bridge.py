"""``kestrel-actors bridge run``: feed batches of a queue into a PySpark job.

Only click is imported here; the bridge itself (and pyspark, when Spark starts) is imported
when the command runs, so ``kestrel-actors --help`` stays fast. Nothing here imports gevent.
"""

from __future__ import annotations

import sys

import click

from ._errors import fail

__all__ = ["EXIT_NEVER_HAD_ITEMS", "bridge"]

EXIT_NEVER_HAD_ITEMS = 6
"""``--until-empty`` (or ``--once``) on a queue that has never held an item on any server."""


class _Duration(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx):
        from ..spark_bridge import parse_duration

        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _KeyValue(click.ParamType):
    name = "key=value"

    def convert(self, value, param, ctx):
        key, sep, _ = value.partition("=")
        if not sep or not key.strip():
            self.fail(f"expected key=value, got {value!r}", param, ctx)
        return value


@click.group()
def bridge() -> None:
    """Spark bridge: run PySpark jobs over batches of a queue (at-least-once; exactly-once in
    effect with --output-path)."""


@bridge.command("run")
@click.option("--servers", default="127.0.0.1:22133", show_default=True,
              help="Comma-separated host:port list; one bridge actor per server.")
@click.option("--queue", required=True, help="Queue to read batches from.")
@click.option("--job", required=True,
              help="package.module:function called as fn(rdd_of_bytes, meta), e.g. "
                   "kestrel_actors.spark_bridge.jobs:word_count.")
@click.option("--job-arg", "job_args", multiple=True, type=_KeyValue(),
              help="key=value passed to the job as meta.args (repeatable).")
@click.option("--batch-size", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Most items per batch (a server caps one monitor at --monitor-max-items).")
@click.option("--batch-wait", default="1s", show_default=True, type=_Duration(),
              help="Longest wait for a batch to fill (monitor counts whole seconds).")
@click.option("--partitions", default=4, show_default=True, type=click.IntRange(min=1),
              help="numSlices for sc.parallelize.")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master: local[N], local[*] or spark://host:port.")
@click.option("--conf", "spark_conf", multiple=True, type=_KeyValue(),
              help="Spark setting key=value (repeatable); overrides the bridge's defaults.")
@click.option("--output-queue", default=None, help="Write results as items to this queue.")
@click.option("--output-path", default=None,
              help="Write results under DIR/batch=<id>/ (mode overwrite).")
@click.option("--output-format", type=click.Choice(["json", "parquet"]), default="json",
              show_default=True, help="File format for --output-path.")
@click.option("--state-dir", default=None,
              help="Where batch counters live [default: OUTPUT_PATH/_kestrel_bridge, else "
                   "$XDG_STATE_HOME/kestrel-actors/bridge].")
@click.option("--once", is_flag=True,
              help="Process one batch per server (or find the queue empty), then exit.")
@click.option("--max-batches", default=0, type=click.IntRange(min=0),
              help="Exit after this many non-empty batches per server (0: no limit).")
@click.option("--until-empty", is_flag=True,
              help="Exit once a batch wait passes with the queue empty.")
@click.option("--max-failures", default=5, show_default=True, type=click.IntRange(min=0),
              help="After this many failed job attempts of one batch, move its items to the "
                   "dead-letter queue and go on (0: retry for ever). Unreachable servers and "
                   "job timeouts are always retried.")
@click.option("--dead-letter-queue", default=None,
              help="Where a batch goes after --max-failures [default: QUEUE_failed, same "
                   "server].")
@click.option("--job-timeout", default="0s", show_default=True, type=_Duration(),
              help="Cancel a batch's Spark jobs after this long and return its items to the "
                   "queue (0: no limit).")
@click.option("--keep-alive", default="1s", show_default=True, type=_Duration(),
              help="Ping the server this often while Spark works, so --client-timeout on the "
                   "server never takes a batch back mid-job (0: never).")
@click.option("--py-files", default="",
              help="Comma-separated .py/.zip/.egg files shipped to the executors (the job's "
                   "own module is shipped too when it is not installed).")
@click.option("--retry-max", default="30s", show_default=True, type=_Duration(),
              help="Longest backoff between attempts.")
@click.option("--log-format", type=click.Choice(["console", "json"]), default="console",
              show_default=True)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
def run(servers, queue, job, job_args, batch_size, batch_wait, partitions, master, spark_conf,
        output_queue, output_path, output_format, state_dir, once, max_batches, until_empty,
        max_failures, dead_letter_queue, job_timeout, keep_alive, py_files, retry_max,
        log_format, log_level) -> None:
    """Run the bridge in the foreground until stopped (SIGINT/SIGTERM finish the batch in
    flight; a second signal exits at once, leaving unconfirmed items to the server).

    Exit codes: 0 done, 1 some batch was moved to the dead-letter queue, 2 usage error or
    another bridge holds the batch ledger, 6 --until-empty/--once found a queue that has never
    held an item on any server (nothing was loaded: Spark is not started)."""
    import logging

    from ..logs import configure_logging
    from ..spark_bridge import BridgeConfig, LedgerLockedError, ProgressLine, load_job, run_bridge

    if output_queue and output_path:
        raise click.UsageError("give at most one of --output-queue and --output-path")
    configure_logging(log_format, log_level)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per closed connection
    try:
        config = BridgeConfig(
            queue=queue, job=job, servers=servers, job_args=job_args, batch_size=batch_size,
            batch_wait=batch_wait, partitions=partitions, master=master,
            spark_conf=spark_conf, output_queue=output_queue, output_path=output_path,
            output_format=output_format, state_dir=state_dir,
            max_batches=1 if once else max_batches, until_empty=until_empty or once,
            max_failures=max_failures, dead_letter_queue=dead_letter_queue,
            job_timeout=job_timeout, keep_alive=keep_alive, py_files=py_files,
            retry_max=retry_max,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    try:
        load_job(job, config.py_files)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise click.BadParameter(f"cannot load {job!r}: {exc}", param_hint="--job") from None
    try:
        report = run_bridge(config, progress=ProgressLine(sys.stderr), handle_signals=True)
    except LedgerLockedError as exc:
        fail(str(exc), 2)
    if report.never_had_items:
        fail(f"queue {queue} has never held an item on {', '.join(report.never_had_items)}: "
             f"nothing to process (load it first; was the name or --servers mistyped?)",
             EXIT_NEVER_HAD_ITEMS)
    sys.exit(0 if report.ok else 1)
