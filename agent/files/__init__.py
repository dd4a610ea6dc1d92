"""Writing files: the only place the agent touches the output directory."""
