"""GPU accounting and idle allocations (pure): who holds which share of which GPU, and who holds one idle.

Shared by the balancer (which exports what it holds and reclaims idle allocations where a policy
allows) and ``gpugate usage`` (which reads the recorded accounting back from Prometheus).
"""
