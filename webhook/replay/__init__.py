"""Replay a GPU cluster trace through gpugate's mutation and a kube-scheduler model.

``trace`` loads the openb format (or makes a synthetic one), ``workload`` turns trace rows into
real Pod objects, ``demand`` reads a Pod back into what the scheduler needs, ``model`` is the pure
kube-scheduler model, ``reference`` the published schedulers (Random, BestFit, FGD), ``metrics``
allocation and fragmentation, ``runner`` the seeded arrival loop, ``report`` the table, CSV, JSON
and plot. numpy and matplotlib (the ``replay`` extra) are imported only inside this package.
"""
