"""The node-load balancer: watch GPU nodes and pods, label each GPU node with its load.

Layers: ``tiers``, ``state``, ``marks``, ``backoff`` and ``settings`` are pure (data in, data out);
``cluster`` (kubernetes client), ``prometheus`` (DCGM query), ``lease`` (leader election),
``health`` (HTTP) are edges; ``controller`` wires them into one loop.
"""
