"""topology-agent: makes a multi-pod training job on Kubernetes configure itself.

Layers, low to high: ``agent.core`` (pure: pods -> Topology -> file bytes), ``agent.files`` (atomic writes),
``agent.cli`` (the command line). An import-linter contract in pyproject.toml keeps the core free of I/O.
"""

__version__ = "0.1.0"
