"""The e2e tests' name for :mod:`webhook.localcluster.fakekubelet` (moved into the package for ``gpugate demo``).

The same module object, not a copy: ``tests.e2e.fakekubelet`` and ``webhook.localcluster.fakekubelet`` are one.
"""

import sys

from webhook.localcluster import fakekubelet

sys.modules[__name__] = fakekubelet
