"""XGBoost trained in one process across a membership change: the group forms from the agent's files, each rank
trains on its own data, and when a pod joins the group forms again at a round boundary and training goes on from
the model. One line per round: world, rank, rounds, the model's hash (the same on every rank only if the
histograms were all-reduced) and the tracker's port. Stops 5 rounds after the world reached ``until`` processes.
Arguments: the shared volume, the record file, until."""

import hashlib
import sys
import time

import numpy as np
import xgboost as xgb

from agent.trainer.xgboost import Group

out, record, until = sys.argv[1], sys.argv[2], int(sys.argv[3])
group = Group(out, pid_file=f"{out}/trainer.pid")
booster = group.form(None)
stop_at = None
while stop_at is None or booster.num_boosted_rounds() < stop_at:
    if group.changed():
        booster = group.form(booster)
    rows = np.random.default_rng(group.rank).normal(size=(500, 8))
    labels = (rows[:, 0] + rows[:, 1] > 0).astype(int)
    booster = xgb.train({"objective": "binary:logistic", "tree_method": "hist", "nthread": 1, "max_depth": 3},
                        xgb.DMatrix(rows, labels), 1, xgb_model=booster)
    rounds = booster.num_boosted_rounds()
    if stop_at is None and group.world_size >= until:
        stop_at = rounds + 5
    with open(record, "a") as handle:
        handle.write(f"world={group.world_size} rank={group.rank} rounds={rounds} "
                     f"model={hashlib.sha256(bytes(booster.save_raw())).hexdigest()[:16]} "
                     f"port={group.arguments['dmlc_tracker_port'] if group.arguments else '?'}\n")
    time.sleep(0.3)  # a round every ~0.3 s, so that the third pod joins while the others train
group.close()
