"""Merging processes' expositions: counters and histograms add up, in-flight gauges add
up, other gauges take the highest, start times the lowest."""

from __future__ import annotations

from edge.obs.multiproc import merge

ONE = """# HELP r_total Requests.
# TYPE r_total counter
r_total{route="/a",status="200"} 3
# HELP h_seconds Latency.
# TYPE h_seconds histogram
h_seconds_bucket{le="0.1"} 1
h_seconds_bucket{le="+Inf"} 2
h_seconds_sum 0.5
h_seconds_count 2
# HELP s_in_flight Streams.
# TYPE s_in_flight gauge
s_in_flight 2
# HELP w Weight.
# TYPE w gauge
w{pool="v1"} 1.0
# HELP start_time_seconds Start.
# TYPE start_time_seconds gauge
start_time_seconds 100.5
"""
TWO = """# HELP r_total Requests.
# TYPE r_total counter
r_total{route="/a",status="200"} 4
r_total{route="/b",status="429"} 1
# HELP h_seconds Latency.
# TYPE h_seconds histogram
h_seconds_bucket{le="0.1"} 0
h_seconds_bucket{le="+Inf"} 1
h_seconds_sum 0.25
h_seconds_count 1
# HELP s_in_flight Streams.
# TYPE s_in_flight gauge
s_in_flight 1
# HELP w Weight.
# TYPE w gauge
w{pool="v1"} 1.0
# HELP start_time_seconds Start.
# TYPE start_time_seconds gauge
start_time_seconds 99.25
"""


def test_expositions_of_processes_merge_by_kind():
    assert merge([ONE, TWO]) == (
        "# HELP r_total Requests.\n# TYPE r_total counter\n"
        'r_total{route="/a",status="200"} 7\nr_total{route="/b",status="429"} 1\n'
        "# HELP h_seconds Latency.\n# TYPE h_seconds histogram\n"
        'h_seconds_bucket{le="0.1"} 1\nh_seconds_bucket{le="+Inf"} 3\n'
        "h_seconds_sum 0.75\nh_seconds_count 3\n"
        "# HELP s_in_flight Streams.\n# TYPE s_in_flight gauge\ns_in_flight 3\n"
        '# HELP w Weight.\n# TYPE w gauge\nw{pool="v1"} 1\n'
        "# HELP start_time_seconds Start.\n# TYPE start_time_seconds gauge\n"
        "start_time_seconds 99.25\n"
    )
    assert merge([ONE]) == merge([ONE, ""])
