"""The balancer's exception tree.

One tree for both planes: the data plane (``rustext``) defines the classes,
the control plane raises the same ones, so callers catch a single root::

    BalancerError(RustextError)                 any balancer failure
    └── BalancerConfigError(BalancerError, ValueError)   invalid configuration
"""

from __future__ import annotations

from rustext import BalancerConfigError, BalancerError

__all__ = ["BalancerConfigError", "BalancerError"]
