"""One TensorFlow task per pod from TF_CONFIG (tf.env) alone: MultiWorkerMirroredStrategy all-reduces every
task's index + 1, recorded, then idle until the launcher stops it. Argument: the record file."""

import json
import os
import signal
import sys
import time

import tensorflow as tf

task = json.loads(os.environ["TF_CONFIG"])["task"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()


@tf.function
def step() -> tf.Tensor:
    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(float(task["index"] + 1)))


total = float(strategy.experimental_local_results(strategy.run(step))[0])
with open(sys.argv[1], "a") as record:
    record.write(f"world={strategy.num_replicas_in_sync} rank={task['index']} sum={total:.0f}\n")
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # a trainer would save its checkpoint here
while True:
    time.sleep(1)
