"""The e2e tests' name for :mod:`webhook.localcluster.binaries` (moved into the package for ``gpugate demo``).

The same module object, not a copy: ``tests.e2e.binaries`` and ``webhook.localcluster.binaries`` are one.
"""

import sys

from webhook.localcluster import binaries

if __name__ == "__main__":
    sys.exit(binaries.main(sys.argv[1:]))
sys.modules[__name__] = binaries
