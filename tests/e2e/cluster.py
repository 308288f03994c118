"""The e2e tests' name for :mod:`webhook.localcluster.cluster` (moved into the package for ``gpugate demo``).

The same module object, not a copy: ``tests.e2e.cluster`` and ``webhook.localcluster.cluster`` are one.
"""

import sys

from webhook.localcluster import cluster

if __name__ == "__main__":
    sys.exit(cluster.main(sys.argv[1:]))
sys.modules[__name__] = cluster
