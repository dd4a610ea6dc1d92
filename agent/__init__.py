"""topology-agent: makes a multi-pod training job on Kubernetes configure itself.

Layers, low to high, each importing only those below it (import-linter contracts in pyproject.toml):
``agent.errors`` (one exception tree); ``agent.core`` (pure: pods -> plan -> file bytes; no I/O, no clock);
``agent.examples`` (the controllers' pods, for the demo and the tests); ``agent.k8s`` (the API client),
``agent.files`` (atomic writes), ``agent.ssh`` (key material) and ``agent.sandbox`` (the sandbox API server),
independent of each other; ``agent.flags`` (the command line's grammar: each command's flags, their checks and
the settings they give); ``agent.runtime`` (init, the sidecar, the webhook); ``agent.cli`` (dispatch, exit codes,
the process's life). ``agent.trainer``, for training scripts, stands apart: it imports nothing else of the agent.
docs/architecture.md has the module map and the data paths.
"""

__version__ = "0.1.0"
