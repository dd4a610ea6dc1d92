"""Reports: Events and the rows of `topology-agent status`."""
