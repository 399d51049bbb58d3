"""`tollgate_kafka_consumer_lag` is read from Kafka by every process that runs consumers (each
service's process in the split and compose shapes), so each partition's lag arrives once per such
process. The dashboard counts it once: the max across processes, then summed per group. (The alert
rule's own test, with two processes reporting, is in deploy/prometheus/tests.yml.)"""

import re

from tests.support.monitoring import panel_expressions

LAG = "tollgate_kafka_consumer_lag"
ONE_PER_PARTITION = re.compile(r"max by \(group, topic, partition\) \(\s*(?:delta\()?" + LAG)


def test_the_dashboard_counts_each_partitions_lag_once_whatever_the_number_of_processes():
    lag_panels = [expr for expr in panel_expressions() if LAG in expr]
    assert lag_panels
    for expr in lag_panels:
        assert expr.count(LAG) == len(ONE_PER_PARTITION.findall(expr)), expr
