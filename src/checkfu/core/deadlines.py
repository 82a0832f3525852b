"""How long the runner waits for each member: the contract's table (``checkfu.contract.deadlines``)."""

from checkfu.contract.deadlines import DEFAULT_DEADLINES

__all__ = ["DEFAULT_DEADLINES"]
