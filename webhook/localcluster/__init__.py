"""A local Kubernetes control plane on 127.0.0.1 with fake GPU nodes: what ``gpugate demo`` runs and
the e2e tests (tests/e2e) judge gpugate against.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are built from the Go modules in
``toolchain/`` (shipped with the package, so an installed gpugate can build them too) and cached in
``${GPUGATE_E2E_CACHE:-~/.cache/gpugate/e2e}`` (:mod:`binaries`); :mod:`controlplane` starts them on
free loopback ports with their own PKI (:mod:`pki`, :mod:`processes`); :mod:`fakekubelet` keeps nodes
Ready and bound pods Running; :mod:`cluster` puts them together. Every module here is an edge.
"""
