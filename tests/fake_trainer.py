"""A stand-in trainer: records every signal it gets, with the generation on disk at that moment, in the record
file and on stdout (a test reads its stdout to await each signal); "ready" on stdout once its handlers are in."""

import os
import signal
import sys
from pathlib import Path

record, shared = Path(sys.argv[1]), Path(sys.argv[2])


def handler(signum, _frame):
    try:
        generation = (shared / "generation").read_text().strip()
    except OSError:
        generation = "?"
    line = f"{signal.Signals(signum).name} {generation}"
    with record.open("a") as out:
        out.write(line + "\n")
    print(line, flush=True)


for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
    signal.signal(sig, handler)
Path(str(record) + ".pid").write_text(str(os.getpid()))
print("ready", flush=True)
while True:
    signal.pause()
