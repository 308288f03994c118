"""The e2e tests' name for :mod:`webhook.localcluster.controlplane` (moved into the package for ``gpugate demo``).

The same module object, not a copy: ``tests.e2e.controlplane`` and ``webhook.localcluster.controlplane`` are one.
"""

import sys

from webhook.localcluster import controlplane

sys.modules[__name__] = controlplane
