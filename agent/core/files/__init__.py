"""The files: each file's renderer (torch.env, hostfile, ssh_config, topology.json, every framework's) and explain's
provenance."""
