"""A large job's publication, the shell's side: who leads (election.py, the Lease; leading.py, init's guard and
lead), what the leader writes (publishing.py: the snapshot, the journal and the summary; block_writing.py: the
topology order's blocks) and what init hands the sidecar (handoff.py). The pure rules are core/publication/."""
