#!/usr/bin/env python3
"""Bursts of jobs submitted at once on a secured cluster: issue 53's item 1.

A `pipewise coordinator` with submitter and worker tokens (and, with --mtls, TLS with client
certificates from `pipewise certs`) and WORKERS `pipewise worker` processes on loopback, each
with its own data directory; BURSTS times, JOBS three-step emulated 1F1B jobs are submitted
at once and followed until they end. A follower that takes up a run before worker 0 (the
collectives' root) must wait for it at the start barrier, not fail on the run secret.

usage: bench/burst.py target/release/pipewise WORKERS BURSTS JOBS [--mtls]

Prints, per burst, how many jobs succeeded (and the status line of any that did not), then
the total. Linux only; not part of CI (cli/tests/security.rs runs a burst of 8)."""
import os, subprocess, sys, tempfile, time, concurrent.futures as cf

binary, workers, bursts, jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mtls = "--mtls" in sys.argv
d = tempfile.mkdtemp(prefix="burst-")
open(f"{d}/sub.token", "w").write("submit-token-1\n")
open(f"{d}/work.token", "w").write("worker-token-1\n")
procs = []
def spawn(args, log):
    p = subprocess.Popen([binary] + args, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    procs.append(p)
    return p
tls_c, tls_w, tls_s = [], [], []
scheme = "http"
if mtls:
    subprocess.run([binary, "certs", f"{d}/certs"], check=True, capture_output=True)
    c = f"{d}/certs"
    tls_c = ["--tls-cert", f"{c}/coordinator.pem", "--tls-key", f"{c}/coordinator.key", "--tls-client-ca", f"{c}/ca.pem"]
    tls_w = ["--tls-ca", f"{c}/ca.pem", "--tls-cert", f"{c}/worker.pem", "--tls-key", f"{c}/worker.key"]
    tls_s = ["--tls-ca", f"{c}/ca.pem"]
    scheme = "https"
coord = spawn(["coordinator", "--listen", "127.0.0.1:0", "--data-dir", f"{d}/data",
               "--submitter-token-file", f"{d}/sub.token", "--worker-token-file", f"{d}/work.token"] + tls_c,
              f"{d}/coordinator.log")
addr = coord.stdout.readline().split()[3]
url = f"{scheme}://{addr}"
for w in range(workers):
    p = spawn(["worker", "--coordinator", url, "--id", f"w{w}", "--token-file", f"{d}/work.token",
               "--data-dir", f"{d}/w{w}"] + tls_w, f"{d}/w{w}.log")
    p.stdout.readline()
client = ["--coordinator", url, "--token-file", f"{d}/sub.token"] + tls_s
spec = f"""[job]
name = "burst"
[model]
vocab = 256
hidden = 32
heads = 2
layers = 8
seq_len = 16
dtype = "f32"
[training]
global_batch_size = 8
steps = 3
seed = 42
[optimizer]
lr = 3e-3
[parallelism]
pipeline_parallel_degree = {workers}
pipeline_parallel_schedule = "1f1b"
pipeline_parallel_microbatch_size = 1
[compute]
mode = "emulate"
f_ms = 1.0
b_ms = 1.0
w_ms = 1.0
"""
open(f"{d}/job.toml", "w").write(spec)
def submit(_):
    out = subprocess.run([binary, "submit", f"{d}/job.toml"] + client, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return out.stdout.split()[1], ""
total_ok = 0
try:
    for b in range(bursts):
        with cf.ThreadPoolExecutor(jobs) as ex:
            ids = list(ex.map(submit, range(jobs)))
        refused = [e for i, e in ids if i is None]
        ids = [i for i, _ in ids if i is not None]
        deadline = time.time() + 600
        states = {}
        while time.time() < deadline:
            out = subprocess.run([binary, "status"] + client, capture_output=True, text=True).stdout
            states = {l.split()[1]: l for l in out.splitlines() if l.startswith("job ") and l.split()[1] in ids}
            if len(states) == len(ids) and all((" succeeded " in l or " failed " in l or " cancelled " in l) for l in states.values()):
                break
            time.sleep(0.5)
        ok = sum(" succeeded " in l for l in states.values())
        total_ok += ok
        print(f"burst {b + 1}: {ok} of {jobs} succeeded" + (f"; {len(refused)} submits refused: {refused[:1]}" if refused else ""), flush=True)
        for l in states.values():
            if " succeeded " not in l:
                print("   ", l[:300])
finally:
    for p in procs:
        p.kill()
print(f"{'mTLS + tokens' if mtls else 'tokens'}, {workers} workers: {total_ok} of {bursts * jobs} jobs succeeded ({d})")
