"""The pytest plugin of the pipeline tests, loaded by each test module with
`pytest_plugins = ["pipeline_fixtures"]`: cluster.py's fixtures (protos, cluster_factory,
module_clusters) and its hook that adds the daemons' logs to a failed test's report. A module of its
own because the test modules import cluster.py's helpers first, and pytest can no longer rewrite
the asserts of a plugin module that is already imported (it warns)."""
from cluster import cluster_factory, module_clusters, protos, pytest_runtest_makereport

__all__ = ["cluster_factory", "module_clusters", "protos", "pytest_runtest_makereport"]
