"""checkfu: the sandbox provider seam of an agent-running platform."""

__version__ = "0.1.0"
