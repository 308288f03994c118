"""The e2e tests' name for :mod:`webhook.localcluster.pki` (moved into the package for ``gpugate demo``).

The same module object, not a copy: ``tests.e2e.pki`` and ``webhook.localcluster.pki`` are one.
"""

import sys

from webhook.localcluster import pki

sys.modules[__name__] = pki
