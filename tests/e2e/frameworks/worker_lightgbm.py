"""LightGBM's data-parallel training from XGBoostJob's names in xgboost.env alone (MASTER_ADDR, MASTER_PORT,
WORKER_ADDRS, WORKER_PORT, WORLD_SIZE, RANK): each machine trains on its own data; the trees are the same on every
machine only if they were grown together. Records the world and the model's hash, then idles until the launcher
stops it. Argument: the record file."""

import hashlib
import os
import signal
import sys
import time

import lightgbm as lgb
import numpy as np

env = os.environ
machines = [f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"]
machines += [f"{address}:{env['WORKER_PORT']}" for address in env.get("WORKER_ADDRS", "").split(",") if address]
rank = int(env["RANK"])
rows = np.random.default_rng(rank).normal(size=(2000, 8))
labels = (rows[:, 0] + rows[:, 1] > 0).astype(int)
booster = lgb.train({"objective": "binary", "tree_learner": "data", "num_machines": int(env["WORLD_SIZE"]),
                     "machines": ",".join(machines), "local_listen_port": int(machines[rank].rsplit(":", 1)[1]),
                     "num_threads": 1, "verbose": -1, "time_out": 2}, lgb.Dataset(rows, labels), 5)
model = hashlib.sha256(booster.model_to_string().encode()).hexdigest()[:16]
with open(sys.argv[1], "a") as record:
    record.write(f"world={env['WORLD_SIZE']} rank={rank} model={model}\n")
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # a trainer would save its checkpoint here
while True:
    time.sleep(1)
