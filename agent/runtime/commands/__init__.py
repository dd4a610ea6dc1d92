"""The commands that read or write once and end: ``inject`` (inject.py: the agent added to a user's manifests,
comments and layout kept), ``keygen`` (keygen.py: a job's SSH Secret) and ``status`` (status.py: a job's members
as its agents see them). agent/cli.py calls each with the settings its flags give."""
