"""The plan: each pod's facts, the gang a job waits for, and the planner that gives ranks and addresses."""
