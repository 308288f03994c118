"""Replay a GPU cluster trace through gpugate's mutation and a kube-scheduler model.

``trace`` loads the openb format (or makes a synthetic one), ``workload`` turns trace rows into
real Pod objects, ``demand`` reads a Pod back into what the scheduler needs, ``model`` is the pure
kube-scheduler model, ``reference`` the published schedulers (Random, BestFit, FGD), ``metrics``
allocation and fragmentation, ``arms`` the table of arms, ``worlds`` the sharing worlds (timeslice slots, DRA
consumable-capacity claims), ``runspec`` a run's spec and result, ``admitting`` the webhook's
decision per pod, ``runner`` the seeded arrival loop, ``report`` the table, CSV, JSON
and plot. numpy and matplotlib (the ``replay`` extra) are imported only inside this package.
"""
