"""The latency histogram: bounded memory, percentiles within a bucket, arithmetic on copies."""

from __future__ import annotations

import bisect
import random

from kestrel_actors.stats import BOUNDS, BUCKETS, Histogram, QueueMetrics, bucket_index


def test_memory_is_fixed_whatever_is_recorded():
    histogram = Histogram()
    size = len(histogram.buckets)
    rng = random.Random(7)
    for _ in range(100_000):
        histogram.add(int(rng.lognormvariate(6, 2)))
    histogram.add(2**40)  # beyond the last bound: the overflow bucket
    histogram.add(-5)  # a clock step backwards counts as 0
    assert len(histogram.buckets) == size == len(BOUNDS) + 1 == BUCKETS  # the buckets and the overflow
    assert histogram.count == 100_002


def test_a_value_goes_to_the_first_bucket_whose_bound_is_not_below_it():
    # bucket_index works the bucket out from the bounds' rule; a search of BOUNDS is the truth
    near_bounds = [bound + step for bound in BOUNDS for step in (-1, 0, 1)]
    near_powers = [2**power + step for power in range(40) for step in (-1, 0, 1)]
    for value in [*range(-10, 70_000), *near_bounds, *near_powers]:
        assert bucket_index(value) == bisect.bisect_left(BOUNDS, value), value


def test_percentiles_are_within_a_bucket_of_the_truth():
    rng = random.Random(11)
    values = sorted(int(rng.expovariate(1 / 500)) + 1 for _ in range(20_000))
    histogram = Histogram()
    for value in values:
        histogram.add(value)
    for fraction in (0.5, 0.9, 0.99, 0.999):
        true = values[int(fraction * len(values)) - 1]
        assert true <= histogram.percentile(fraction) <= true * 1.26 + 1, fraction
    assert histogram.maximum() >= values[-1] and histogram.maximum() <= values[-1] * 1.26
    assert histogram.minimum() == values[0]  # exact below 9
    assert histogram.sum == sum(values)


def test_small_values_are_exact():
    histogram = Histogram()
    for value in (1, 2, 3, 3, 8):
        histogram.add(value)
    assert (histogram.minimum(), histogram.percentile(0.5), histogram.maximum()) == (1, 3, 8)


def test_minus_merge_and_cumulative():
    before = Histogram()
    before.add(10)
    after = before.copy()
    after.add(100, times=3)
    delta = after.minus(before)
    assert (delta.count, delta.sum) == (3, 300)
    assert 100 <= delta.minimum() == delta.maximum() <= 126  # the upper bound of 100's bucket
    merged = Histogram()
    merged.merge(before)
    merged.merge(delta)
    assert merged.buckets == after.buckets
    assert merged.sum == after.sum == 310
    assert after.cumulative((1, 16, 128, 4**15)) == [0, 1, 4, 4]


def test_a_queues_metrics_copy_keeps_counts_and_sums_apart_from_the_original():
    metrics = QueueMetrics()
    metrics.histogram("set_latency_usec").add(40, times=3)
    assert metrics.set_latency is metrics.histogram("set_latency_usec")  # the request path's slot
    copy = metrics.copy()
    metrics.histogram("set_latency_usec").add(1000)
    assert (copy.histogram("set_latency_usec").count, copy.histogram("set_latency_usec").sum) == (3, 120)
    assert (metrics.histogram("set_latency_usec").count, metrics.histogram("set_latency_usec").sum) == (4, 1120)
