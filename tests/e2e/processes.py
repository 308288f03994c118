"""The e2e tests' name for :mod:`webhook.localcluster.processes` (moved into the package for ``gpugate demo``).

The same module object, not a copy: ``tests.e2e.processes`` and ``webhook.localcluster.processes`` are one.
"""

import sys

from webhook.localcluster import processes

sys.modules[__name__] = processes
