"""The publication large jobs use: one pod lists the pods and publishes them; the others read it (snapshot, journal,
summary, the Lease and who leads)."""
