"""A Ray cluster of simulated nodes on this machine, for the tests and the benchmarks.

    with ray_cluster.local_cluster(num_nodes=2) as (cluster, nodes):
      pool = ray_pool.RaySandboxPool(factory, num_workers=2)   # one actor per node
      cluster.remove_node(nodes[0])                            # a node goes away

Every process of it listens on 127.0.0.1 only, with no dashboard and no usage stats, and
keeps its files in a fresh temporary directory: nothing reaches another machine, and what a
killed run leaves behind (its session directory, `ray_current_cluster`) is never read by the
next one, which connects by explicit address. The head node offers no CPUs (it stands for the
accelerator host); each further node offers `cpus_per_node` CPUs and the sandbox resource.
Nodes are declared dead after 3 missed health checks of 0.5 s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator

# Read by Ray when it is imported: loopback addresses for every node (Ray otherwise resolves
# 127.0.0.1 to the machine's outward address) and no usage report.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
OBJECT_STORE_BYTES = 100 << 20  # per node: snapshots are kilobytes
HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                 "health_check_initial_delay_ms": 0}


def use_loopback() -> None:
  """Sets `LOOPBACK_ENV` for this process and the ones it starts; call before importing ray."""
  os.environ.update(LOOPBACK_ENV)


@contextlib.contextmanager
def local_cluster(num_nodes: int = 2, cpus_per_node: int = 2,
                  resource: str = "sandbox_node") -> Iterator[tuple]:
  """A head and `num_nodes` sandbox nodes, this process connected to it; yields the
  `ray.cluster_utils.Cluster` and the sandbox nodes."""
  use_loopback()
  import ray  # pylint: disable=g-import-not-at-top
  from ray import cluster_utils  # pylint: disable=g-import-not-at-top
  temp_dir = tempfile.mkdtemp(prefix="bpo_ray_")
  # The head node writes its address to a file under Ray's default temp directory whatever
  # `temp_dir` says; on a machine where Ray never ran, that directory does not exist yet.
  from ray._private import utils as ray_utils  # pylint: disable=g-import-not-at-top
  os.makedirs(os.path.dirname(ray_utils.get_ray_address_file(None)), exist_ok=True)
  cluster = None
  try:
    cluster = cluster_utils.Cluster(
        initialize_head=True, connect=False,
        head_node_args=dict(num_cpus=0, include_dashboard=False, node_ip_address="127.0.0.1",
                            object_store_memory=OBJECT_STORE_BYTES, temp_dir=temp_dir,
                            _system_config=HEALTH_CHECKS))
    nodes = [add_node(cluster, cpus_per_node, resource) for _ in range(num_nodes)]
    ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield cluster, nodes
  finally:
    ray.shutdown()
    if cluster is not None:
      cluster.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


def add_node(cluster, cpus: int = 2, resource: str = "sandbox_node"):
  """One more sandbox node of `cluster`."""
  return cluster.add_node(num_cpus=cpus, resources={resource: 1.0} if resource else {},
                          node_ip_address="127.0.0.1", object_store_memory=OBJECT_STORE_BYTES)
