"""The webhook's decision for each replayed Pod (``CachedAdmission``): the real mutation and validation.

An edge: it loads the policy folder a run names. ``runner`` and ``sizing`` both admit through it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from webhook.kube.inventory import EMPTY as EMPTY_INVENTORY
from webhook.kube.inventory import Inventory
from webhook.policy import loading


class CachedAdmission:
    """The webhook's decision for each Pod: validate, then apply the mutation's JSON patch.

    Pure functions of (pod, namespace, policies): pods equal but for their name are admitted once
    and the answer reused, which is what makes the real mutation code affordable per trace pod.
    """

    def __init__(self, policies_dir: str | None) -> None:
        from webhook.admission import chain
        from webhook.policy import PolicySet

        self.chain = chain
        self.policies = loading.load_dir(Path(policies_dir)) if policies_dir else PolicySet.empty()
        self.cache: dict[str, dict[str, Any] | None] = {}
        self.applied: dict[str, int] = {}

    def admit(self, pod: dict[str, Any], inventory: Inventory = EMPTY_INVENTORY,
              inventory_key: str = "") -> dict[str, Any] | None:
        """The stored Pod, or None when the validating webhook denies it.

        ``inventory`` is the balancer's GPUInventory the webhook reads; ``inventory_key`` names
        what in it can change the answer (equal keys, equal answers), so the cache stays exact.
        """
        template = copy.deepcopy(pod)
        name = template["metadata"].pop("name")
        key = json.dumps(template, sort_keys=True) + inventory_key
        if key not in self.cache:
            namespace = pod["metadata"]["namespace"]
            # The API server's order: mutate, then validate the mutated pod.
            outcome = self.chain.admit(copy.deepcopy(pod), namespace=namespace, policies=self.policies,
                                       inventory=inventory)
            if outcome.stored is None:
                self.cache[key] = None
            else:
                stored = copy.deepcopy(outcome.stored)
                stored["metadata"].pop("name", None)
                self.cache[key] = stored
                policy = str(outcome.mutation.policy) if outcome.mutation.policy else "(none)"
                self.applied[policy] = self.applied.get(policy, 0) + 1
        admitted = self.cache[key]
        if admitted is None:
            return None
        out = copy.copy(admitted)
        out["metadata"] = {**admitted["metadata"], "name": name}
        return out
