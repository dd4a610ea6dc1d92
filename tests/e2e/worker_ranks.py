"""A trainer that compares its ranks as torchrun gave them (GROUP_RANK, RANK, LOCAL_RANK: set for this worker
from c10d's round) with the agent's (NODE_RANK from torch.env, this pod's member in topology.json).
Arguments: topology.json, the file to record in (one JSON line per worker)."""

import json
import os
import sys

with open(sys.argv[1]) as handle:
    document = json.load(handle)
me = next(m for m in document["members"] if m["name"] == document["self"])
record = {"pod": document["self"], "group_rank": int(os.environ["GROUP_RANK"]), "rank": int(os.environ["RANK"]),
          "local_rank": int(os.environ["LOCAL_RANK"]), "node_rank": int(os.environ["NODE_RANK"]),
          "member_node_rank": me["nodeRank"], "member_rank": me["rank"], "address": me["address"],
          "pet_node_rank": os.environ.get("PET_NODE_RANK")}
with open(sys.argv[2], "a") as out:
    out.write(json.dumps(record) + "\n")
