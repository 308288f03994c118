"""Fragmentation-aware placement scores for kube-scheduler's extender (pure: data in, data out).

FGD's measure (Weng et al., USENIX ATC'23) computed from what the Kubernetes API shows: each
node's allocatable and the requests of the pods bound to it, a model of which physical GPU the
device plugin gave each time-sliced share (the API does not say), and the mix of pod shapes seen
recently. ``inputs`` holds the typed view, ``devices`` the device plugin's allocation model,
``shapes`` the pod-shape mix, ``fragment`` the measure, ``scoring`` the extender's 0..10 scores,
``extender`` the state the balancer keeps and the ExtenderArgs / HostPriorityList wire shapes.
No numpy, no I/O, no clock: the balancer serves this from its watch cache, and the replay runs
the same code against the trace.
"""
