"""Benchmark: peak memory of decoding a hostile published topology (a gzip bomb, deep or wide JSON).

Each case runs in a fresh process: import the agent, note the RSS (VmRSS), decode the document (refused or not),
then read the peak (VmHWM). Reports the peak's rise over the baseline against ``DOCUMENT_CAP``; the target is
<= 2 x the cap whatever the input. Medians of ``--runs`` processes per case.

    python bench/bomb_bench.py --runs 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MIB = 1024 * 1024
CASES: dict[str, Callable[[int], bytes] | None] = {  # name: the uncompressed bytes, from the cap (None: real)
    "64 MiB of {} (the review's bomb)": lambda cap: b"[" + b"{}," * (64 * MIB // 3) + b"{}]",
    "15 MiB of {} (under the text cap)": lambda cap: b"[" + b"{}," * (15 * MIB // 3) + b"{}]",
    "values just under the count cap, as {} (each counts its ',' and its '{')":
        lambda cap: b"[" + b"{}," * (cap // 144 - 40) + b"{}]",
    "values just under the cap, as short strings": lambda cap: b"[" + b'"ab",' * (cap // 72 - 40) + b'"ab"]',
    "values just under the cap, as large ints": lambda cap: b"[" + b"123456789012," * (cap // 72 - 40) + b"1]",
    "one string of 15 MiB": lambda cap: b'["' + b"a" * (15 * MIB) + b'"]',
    "a real 16384-pod snapshot": None,
}

CHILD = """
import gzip, json, resource, sys
from agent.core.publication.published import DOCUMENT_CAP as CAP, decode
from agent.errors import InputError

def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
data = open(sys.argv[1], 'rb').read()
base = status('VmRSS:')
try:
    decode(data)
    outcome = 'decoded'
except InputError as err:
    outcome = 'refused: ' + str(err).split('(')[1].split(')')[0]
print(json.dumps({'rise': status('VmHWM:') - base, 'outcome': outcome, 'cap': CAP}))
"""


def real_snapshot() -> bytes:
    from agent import examples
    from agent.core import Options
    from agent.core.publication.journal import PublishedState, Publisher

    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 16383)))
    publisher = Publisher(PublishedState(job="demo", namespace="default"), Options(address="ip"),
                          leader=pods[0]["metadata"]["name"])
    publisher.change({p["metadata"]["name"]: p for p in pods}, [p["metadata"]["name"] for p in pods])
    return json.dumps(publisher.snapshot_document(), separators=(",", ":")).encode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from agent.core.publication.published import DOCUMENT_CAP, SCHEMA

    print(f"| input | compressed | outcome | peak RSS rise, median of {args.runs} (MB) | rise / cap |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in CASES.items():
            if make is None:
                document = real_snapshot()
            else:  # a hostile document is still shaped like ours around the bomb
                document = b'{"schema":%d,"generation":1,"containers":[],"pods":' % SCHEMA + make(DOCUMENT_CAP) + b"}"
            path = Path(tmp) / "doc.gz"
            path.write_bytes(gzip.compress(document, compresslevel=9))
            runs = [json.loads(subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                                              text=True, check=True).stdout) for _ in range(args.runs)]
            rise = statistics.median(r["rise"] for r in runs)
            print(f"| {name} | {path.stat().st_size / 1e3:.0f} KB | {runs[0]['outcome']} | {rise / 1e6:.1f} "
                  f"({min(r['rise'] for r in runs) / 1e6:.1f}-{max(r['rise'] for r in runs) / 1e6:.1f}) | "
                  f"{rise / DOCUMENT_CAP:.2f} |", flush=True)


if __name__ == "__main__":
    main()
