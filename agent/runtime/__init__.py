"""The shell around the core: init, sidecar, demo, logging."""
