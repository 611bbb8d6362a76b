#!/usr/bin/env python3
"""An emulated multi-host cluster on one machine: the coordinator and each worker in its own
network namespace, every link between them shaped from a named profile (issue 57).

Needs root, `ip` and `tc` (Debian's iproute2) and a kernel with network namespaces, veth,
bridge and htb; standard library only. Linux only; not part of CI except `--smoke`.

    cargo build --release -p pipewise-cli
    sudo python3 bench/cluster.py --pipewise target/release/pipewise              # the table
    sudo python3 bench/cluster.py --profiles wan --schedules 1f1b,v-half --keep
    sudo python3 bench/cluster.py --faults                                         # 5 s and 30 s holes
    python3 bench/cluster.py --smoke --pipewise target/debug/pipewise              # CI (skips unless root)

What it builds (names carry a per-run tag; it deletes only what it made, also on Ctrl-C or
a failure): a bridge in the root namespace holding the relay's address (.1 of a free
10.213.X.0/24), and per node (coordinator, w0, w1, ...) a namespace joined to the bridge by
a veth pair, the node's address .10 + i. The path of every byte between two nodes:
node A's namespace -> A's veth -> bridge -> `pipewise relay` (root namespace, one port per
destination node) -> bridge -> B's veth -> B's namespace. Workers advertise the relay's port
for themselves and dial the coordinator through the relay's port for it; nothing dials a
node's own address except the relay (and `pipewise submit`, which runs in the root
namespace, outside the emulated cluster, straight to the coordinator).

Per link (A, B) the profile sets:
  - latency ± jitter, each direction: the relay delays every chunk it reads by a uniform
    sample of latency ± jitter, never reordering bytes (`--delay netem`, where the kernel has
    netem, puts it in a netem qdisc under the link's htb class instead and the relay delays
    nothing);
  - bandwidth, each direction: an htb class on A's veth pair per destination B, classified
    by the relay port of B (A -> B: A's egress, dport; B -> A: the bridge side's egress
    toward A, sport). Each direction of a link is shaped once.

Profiles (one-way latency, its jitter, the rate): rack 50 us, 0, 25 Gbit/s; zone 500 us,
50 us, 10 Gbit/s; wan 5 ms, 0.5 ms, 1 Gbit/s; `two-group`: the workers in two halves
(the coordinator with the first), rack inside a half, wan between; `none`: the relay
without delay, no shaping (the faults' reference).

The table (default): per profile, 4 workers with emulated compute (bench/job.toml's model,
so the frames are the real activation size, the pass times --pass-ms) and 2 workers with
real compute (bench/job.toml, one thread each, pinned to cores 0 and 1), every schedule of
--schedules; per row the medians over steps 3-8 of the planned and the measured bubble and
of the predicted and the measured step, and issue 57's bounds: |planned - measured| <= 3
points, |predicted / measured - 1| <= 5 %.

--faults: bench/job.toml on 2 real-compute workers with checkpoints every step, --fault-steps
steps, three times: under profile `none` (the reference), then with w1's links black-holed
for 5 s and for 30 s from the step-line --fault-at on (under --fault-profile). It prints the
step lines and `re-planned:` lines of each, and checks that every step's loss and the final
parameters equal the reference's, byte for byte.

--smoke: CI's check (skips with a message, exit 0, unless root and `ip netns` work): 2
emulated workers, 1F1B for 6 steps, under `none` and under `two-group` (w0 and w1 across the
WAN link: the median step must grow by at least the 2 x 5 ms its critical path crosses), then
a 3 s hole on w1 mid-job under `two-group`: every job must finish.
"""

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare import stop_all  # noqa: E402  (the benches' process handling)

JOB = HERE / "job.toml"
SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "v-min", "v-half", "v-zb",
             "adaptive-v"]
# name: (one-way latency ms, jitter ms, rate)
PROFILES = {
    "rack": (0.05, 0.0, "25gbit"),
    "zone": (0.5, 0.05, "10gbit"),
    "wan": (5.0, 0.5, "1gbit"),
}
TOPOLOGIES = ["rack", "zone", "wan", "two-group", "none"]
LINE = re.compile(
    r"^step\s+(?P<step>\d+)(?:/\d+)?\s+loss\s+(?P<loss>\S+)\s+.*?(?P<ms>[\d.]+) ms\s+bubble planned\s+"
    r"(?P<planned>[-\d.]+)%\s+measured\s+(?P<measured>[-\d.]+)%.*?predicted (?P<predicted>[-\d.]+) ms",
    re.M)
COORD_PORT, WORKER_PORT, RELAY_BASE = 50051, 7000, 21000


def sh(*cmd, check=True):
    """Runs `cmd`; its output, or an error naming the command and what it said."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def why_not_here():
    """None where namespaces can be made here, else why not."""
    if sys.platform != "linux":
        return "not Linux"
    if os.geteuid() != 0:
        return "not root (network namespaces and tc need root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` (Debian's iproute2)"
    name = f"pwprobe{os.getpid() % 100000}"
    try:
        sh("ip", "netns", "add", name)
    except RuntimeError as e:
        return f"`ip netns add` fails: {e}"
    sh("ip", "netns", "del", name, check=False)
    return None


def has_netem():
    """Whether the kernel takes a netem qdisc (tried on a veth pair made and deleted here)."""
    a = f"pwnm{os.getpid() % 100000}"
    sh("ip", "link", "add", a, "type", "veth", "peer", "name", a + "p")
    try:
        return subprocess.run(["tc", "qdisc", "add", "dev", a, "root", "netem", "delay", "1ms"],
                              capture_output=True).returncode == 0
    finally:
        sh("ip", "link", "del", a, check=False)


def free_subnet():
    """A 10.213.X prefix no interface here uses."""
    used = sh("ip", "-o", "addr")
    for x in random.sample(range(1, 255), 254):
        if f"10.213.{x}." not in used:
            return f"10.213.{x}"
    raise RuntimeError("no free 10.213.X.0/24")


def link_profile(topology, a, b, workers):
    """(latency ms, jitter ms, rate) of the link between nodes a and b, None: not shaped."""
    if topology == "none":
        return None
    if topology != "two-group":
        return PROFILES[topology]
    group = lambda n: 0 if n == "coordinator" else int(int(n[1:]) >= (workers + 1) // 2)
    return PROFILES["rack"] if group(a) == group(b) else PROFILES["wan"]


def start(cmd, log, core=None, env=None):
    preexec = None
    if core is not None and core < os.cpu_count():
        preexec = lambda: os.sched_setaffinity(0, {core})
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=preexec)


class Cluster:
    """Namespaces, veths, bridge, shaping, relay, coordinator and `workers` workers; a
    context manager that tears all of it down."""

    def __init__(self, binary, workers, topology, delay, folder, seed=1, pin=True):
        self.binary, self.workers, self.topology, self.delay = binary, workers, topology, delay
        self.folder, self.seed, self.pin = folder, seed, pin
        self.tag = f"pw{os.getpid() % 10000:04d}{random.randrange(36 ** 2):03x}"[:9]
        self.nodes = ["coordinator"] + [f"w{i}" for i in range(workers)]
        self.namespaces, self.links, self.procs, self.logs = [], [], [], []
        self.bridge = None
        self.control = None

    # -- names and addresses
    def ns(self, node):
        return f"{self.tag}-{node}"

    def ip(self, node):
        return f"{self.net}.{10 + self.nodes.index(node)}"

    def relay_port(self, node):
        return RELAY_BASE + self.nodes.index(node)

    def in_ns(self, node, *cmd):
        return sh("ip", "netns", "exec", self.ns(node), *cmd)

    # -- set-up
    def __enter__(self):
        try:
            self._network()
            self._processes()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _network(self):
        self.net = free_subnet()
        self.relay_ip = f"{self.net}.1"
        self.bridge = f"{self.tag}br"
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.relay_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for node in self.nodes:
            ns, host = self.ns(node), f"{self.tag}{self.nodes.index(node)}h"
            sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.links.append(host)
            sh("ip", "link", "set", host, "master", self.bridge)
            sh("ip", "link", "set", host, "up")
            self.in_ns(node, "ip", "link", "set", "lo", "up")
            self.in_ns(node, "ip", "addr", "add", f"{self.ip(node)}/24", "dev", "eth0")
            self.in_ns(node, "ip", "link", "set", "eth0", "up")
            self._shape(node, host)

    def _shape(self, node, host):
        """htb classes on node's veth pair, one per destination (see the module doc)."""
        others = [(j, o, link_profile(self.topology, node, o, self.workers))
                  for j, o in enumerate(self.nodes) if o != node]
        if all(p is None for _, _, p in others):
            return
        for side, where, match in (("ns", "eth0", "dport"), ("host", host, "sport")):
            run = (lambda *c: self.in_ns(node, *c)) if side == "ns" else (lambda *c: sh(*c))
            run("tc", "qdisc", "add", "dev", where, "root", "handle", "1:", "htb", "default", "999")
            run("tc", "class", "add", "dev", where, "parent", "1:", "classid", "1:999", "htb",
                "rate", "100gbit", "quantum", "60000")
            for j, other, profile in others:
                if profile is None:
                    continue
                latency, jitter, rate = profile
                cls = f"1:{10 + j}"
                run("tc", "class", "add", "dev", where, "parent", "1:", "classid", cls, "htb",
                    "rate", rate, "ceil", rate, "quantum", "60000")
                if self.delay == "netem":
                    run("tc", "qdisc", "add", "dev", where, "parent", cls, "handle", f"{10 + j}:",
                        "netem", "delay", f"{latency * 1000:.0f}us", f"{jitter * 1000:.0f}us",
                        "limit", "100000")
                run("tc", "filter", "add", "dev", where, "parent", "1:", "protocol", "ip", "prio",
                    "1", "u32", "match", "ip", match, str(self.relay_port(other)), "0xffff",
                    "flowid", cls)

    def _relay_config(self):
        links = []
        if self.delay == "relay":
            for i, a in enumerate(self.nodes):
                for b in self.nodes[i + 1:]:
                    p = link_profile(self.topology, a, b, self.workers)
                    if p is not None:
                        links.append({"between": [a, b], "latency_ms": p[0], "jitter_ms": p[1]})
        port = lambda n: COORD_PORT if n == "coordinator" else WORKER_PORT
        return {
            "seed": self.seed,
            "nodes": [{"name": n, "address": self.ip(n)} for n in self.nodes],
            "routes": [{"to": n, "listen": f"{self.relay_ip}:{self.relay_port(n)}",
                        "target": f"{self.ip(n)}:{port(n)}"} for n in self.nodes],
            "links": links,
        }

    def log(self, name):
        f = open(self.folder / f"{self.tag}-{name}.log", "w")
        self.logs.append(f)
        return f

    def _processes(self):
        config = self.folder / f"{self.tag}-relay.json"
        config.write_text(json.dumps(self._relay_config(), indent=1))
        self.procs.append(start([self.binary, "relay", "--config", str(config)], self.log("relay")))
        m = re.search(r"control on (\S+)", self.wait_for_line("relay", "control on"))
        host, port = m.group(1).rsplit(":", 1)
        self.control = (host, int(port))
        self.data = self.folder / f"{self.tag}-data"
        env = dict(os.environ, RAYON_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.procs.append(start(
            ["ip", "netns", "exec", self.ns("coordinator"), self.binary, "coordinator",
             "--listen", f"{self.ip('coordinator')}:{COORD_PORT}", "--data-dir", str(self.data)],
            self.log("coordinator")))
        # Through the relay a worker's connect always succeeds (the relay takes it) and a
        # coordinator not listening yet shows as a reset, which a worker does not retry:
        # start the workers once it listens.
        self.wait_for_line("coordinator", "coordinator listening on")
        for i in range(self.workers):
            node = f"w{i}"
            self.procs.append(start(
                ["ip", "netns", "exec", self.ns(node), self.binary, "worker",
                 "--coordinator", f"http://{self.relay_ip}:{self.relay_port('coordinator')}",
                 "--listen", f"{self.ip(node)}:{WORKER_PORT}",
                 "--advertise", f"{self.relay_ip}:{self.relay_port(node)}",
                 "--id", f"emu-{node}", "--data-dir", str(self.data)],
                self.log(node), core=i % 2 if self.pin else None, env=env))
        self.url = f"http://{self.ip('coordinator')}:{COORD_PORT}"

    def wait_for_line(self, name, text, timeout=60):
        """The log of the process `name` (the last started) once it holds `text`."""
        path, proc = self.folder / f"{self.tag}-{name}.log", self.procs[-1]
        deadline = time.monotonic() + timeout
        while True:
            log = path.read_text()
            if text in log:
                return log
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{log[-2000:]}")
            time.sleep(0.05)

    def dead(self):
        """'name (exit status)' of each process of the cluster that has ended."""
        return [f"{name} (exit {p.returncode})" for name, p in zip(["relay", *self.nodes], self.procs)
                if p.poll() is not None]

    def blackhole(self, node, seconds):
        with socket.create_connection(self.control, timeout=10) as s:
            s.sendall(f"blackhole {node} {seconds}\n".encode())
            answer = s.makefile().readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"relay: {answer}")
        return answer

    def alive(self):
        return not self.dead()

    def close(self):
        stop_all(self.procs, self.logs)
        self.procs, self.logs = [], []
        # Deleting a namespace deletes its veth end, and with it the bridge side.
        for ns in self.namespaces:
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces = []
        for link in self.links:
            sh("ip", "link", "del", link, check=False)
        self.links = []
        if self.bridge:
            sh("ip", "link", "del", self.bridge, check=False)
            self.bridge = None

    # -- jobs
    def submit(self, job, workers, schedule, steps, timeout, on_line=None):
        """Submits `job` and follows it; (its output, return code). `on_line(line)` sees every
        line as it comes."""
        cmd = [self.binary, "submit", str(job), "--coordinator", self.url, "--wait",
               "--wait-for-coordinator", "60", "--workers", str(workers), "--steps", str(steps),
               "--schedule", schedule]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        reader = threading.Thread(target=lambda: [
            (lines.append(l), on_line and on_line(l)) for l in p.stdout], daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        while p.poll() is None:
            # A node that dies leaves the job waiting: stop at once.
            if not self.alive() or time.monotonic() > deadline:
                p.kill()
                break
            time.sleep(0.1)
        p.wait()
        reader.join(timeout=10)
        return "".join(lines), p.returncode

    def tails(self):
        return "".join(f"--- {f.name}\n{f.read_text()[-800:]}\n"
                       for f in sorted(self.folder.glob(f"{self.tag}-*.log")))


def emulated_job(folder, pass_ms):
    """bench/job.toml's model with 6 blocks (8 pieces: the V and interleaved schedules place
    8 stages on 4 workers), emulated; its frames are the real activation size."""
    f, b, w = pass_ms
    path = folder / "job-emulated.toml"
    text = JOB.read_text().replace("layers = 4", "layers = 6")
    path.write_text(text + f'\n[compute]\nmode = "emulate"\nf_ms = {f}\nb_ms = {b}\nw_ms = {w}\n')
    return path


def checkpointed_job(folder):
    path = folder / "job-checkpointed.toml"
    text = JOB.read_text().replace("enable_checkpoint = false",
                                   'enable_checkpoint = true\nfolder = "ckpt"\ninterval = 1')
    path.write_text(text)
    return path


def medians(rows, first, last):
    kept = [r for r in rows if first <= int(r["step"]) <= last] or rows
    med = lambda key: statistics.median(float(r[key]) for r in kept)
    return med("planned"), med("measured"), med("predicted"), med("ms")


def table(args, binary, folder):
    failed = 0
    print(f"{'profile':<10} {'workers':<13} {'schedule':<17} {'planned':>8} {'measured':>9} "
          f"{'|diff|':>7} {'predicted ms':>13} {'measured ms':>12} {'ratio':>6}  bounds")
    for topology in args.profiles.split(","):
        for kind, workers in (("4 emulated", 4), ("2 real", 2)):
            if kind not in args.kinds:
                continue
            job = emulated_job(folder, args.pass_ms) if workers == 4 else JOB
            with Cluster(binary, workers, topology, args.delay, folder) as c:
                for schedule in args.schedules.split(","):
                    out, rc = c.submit(job, workers, schedule, args.steps, args.timeout)
                    rows = [m.groupdict() for m in LINE.finditer(out)]
                    if rc != 0 or len(rows) < args.steps:
                        failed += 1
                        print(f"{topology:<10} {kind:<13} {schedule:<17} failed (rc {rc}, "
                              f"{len(rows)} step lines):\n{out[-1500:]}", flush=True)
                        if not c.alive():
                            print(f"ended: {', '.join(c.dead())}; the profile's other rows "
                                  f"are left out\n{c.tails()}", flush=True)
                            break
                        continue
                    planned, measured, predicted, ms = medians(rows, args.first, args.steps)
                    diff, ratio = abs(measured - planned), predicted / ms if ms else 0
                    ok = diff <= 3 and abs(ratio - 1) <= 0.05
                    failed += not ok
                    print(f"{topology:<10} {kind:<13} {schedule:<17} {planned:>7.1f}% "
                          f"{measured:>8.1f}% {diff:>6.1f} {predicted:>13.1f} {ms:>12.1f} "
                          f"{ratio:>6.2f}  {'ok' if ok else 'MISSED'}", flush=True)
    return failed


def final_parameters(data):
    """({tensor name: sha256 of its bytes}, the step folder) of the newest job's last step
    under `data`, whatever files (stages) hold them."""
    jobs = sorted(data.glob("ckpt/job-*"), key=lambda p: int(p.name.split("-")[1]))
    if not jobs:
        return {}, "-"
    steps = sorted((p for p in jobs[-1].glob("step-*") if p.is_dir()),
                   key=lambda p: int(p.name.split("-")[1]))
    if not steps:
        return {}, "-"
    tensors = {}
    for f in sorted(steps[-1].rglob("*.safetensors")):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            lo, hi = meta["data_offsets"]
            tensors[name] = hashlib.sha256(raw[8 + n + lo:8 + n + hi]).hexdigest()
    return tensors, steps[-1].name


def faults(args, binary, folder):
    job = checkpointed_job(folder)
    runs = [("reference (profile none)", "none", 0)] + [
        (f"w1 black-holed {s} s from step {args.fault_at} ({args.fault_profile})", args.fault_profile, s)
        for s in args.holes]
    results = []
    for label, topology, seconds in runs:
        with Cluster(binary, 2, topology, args.delay, folder) as c:
            hole = {}

            def watch(line, c=c, seconds=seconds, hole=hole):
                m = LINE.match(line)
                if seconds and not hole and m and int(m["step"]) == args.fault_at:
                    hole["said"] = c.blackhole("w1", seconds)

            begun = time.monotonic()
            out, rc = c.submit(job, 2, "1f1b", args.fault_steps, args.timeout, on_line=watch)
            took = time.monotonic() - begun
            params = final_parameters(c.data)
            losses = {}
            for m in LINE.finditer(out):
                losses[int(m["step"])] = m["loss"]
            print(f"== {label}: rc {rc}, {took:.1f} s" + (f"; relay: {hole['said']}" if hole else ""))
            for line in out.splitlines():
                if LINE.match(line) or line.startswith(("re-planned", "job ", "error")):
                    print("  " + line)
            if rc != 0:
                print(c.tails())
            results.append((label, rc, losses, params))
    ref = results[0]
    failed = 0
    for label, rc, losses, params in results[1:]:
        same_loss = losses == ref[2] and len(losses) == args.fault_steps
        same_params = params == ref[3] and bool(params[0])
        ok = rc == 0 and same_loss and same_params
        failed += not ok
        print(f"{label}: finished {'yes' if rc == 0 else 'NO'}, every step's loss equal to the "
              f"reference: {same_loss}, final parameters ({len(params[0])} tensors, {params[1]}) "
              f"bit-identical: {same_params}")
    return failed


def smoke(args, binary, folder):
    """CI's check: the same emulated job unshaped and across a WAN link, then a hole."""
    job = emulated_job(folder, (2.0, 2.0, 2.0))
    step_ms = {}
    for topology in ("none", "two-group"):
        with Cluster(binary, 2, topology, args.delay, folder, pin=False) as c:
            out, rc = c.submit(job, 2, "1f1b", 6, args.timeout)
            rows = [m.groupdict() for m in LINE.finditer(out)]
            print(out, end="")
            if rc != 0 or len(rows) != 6:
                print(f"smoke: the {topology} job failed (rc {rc}, {len(rows)} step lines)\n"
                      f"{c.tails()}")
                return 1
            step_ms[topology] = medians(rows, 3, 6)[3]
            if topology == "none":
                continue
            hole = {}

            def watch(line, c=c, hole=hole):
                m = LINE.match(line)
                if not hole and m and int(m["step"]) == 2:
                    hole["said"] = c.blackhole("w1", 3)

            out, rc = c.submit(job, 2, "1f1b", 6, args.timeout, on_line=watch)
            print(out, end="")
            print(f"smoke: relay {hole.get('said', 'never asked')}")
            if rc != 0 or not hole or len(LINE.findall(out)) < 6:
                print(f"smoke: the job with a hole failed (rc {rc})\n{c.tails()}")
                return 1
    # Under two-group w0 and w1 sit on either side of the WAN link (5 ms each way): every
    # step's critical path crosses it at least twice (the first forward, the last backward),
    # so the step grows by 10 ms or more over the unshaped one unless the relay delays nothing.
    grew = step_ms["two-group"] - step_ms["none"]
    print(f"smoke: median step {step_ms['none']:.1f} ms unshaped, {step_ms['two-group']:.1f} ms "
          f"across the WAN link (+{grew:.1f} ms, at least 10 expected)")
    if grew < 10:
        return 1
    print("smoke: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipewise", default="target/release/pipewise", help="the pipewise binary")
    ap.add_argument("--profiles", default="rack,zone,wan,two-group",
                    help=f"comma-separated, of {', '.join(TOPOLOGIES)}")
    ap.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated")
    ap.add_argument("--kinds", default="4 emulated,2 real",
                    help="which rows: '4 emulated', '2 real' or both, comma-separated")
    ap.add_argument("--pass-ms", default="20,25,20",
                    help="F,B,W ms of a stage holding 1/d of the model, for the emulated rows")
    ap.add_argument("--steps", type=int, default=8, help="steps per job")
    ap.add_argument("--first", type=int, default=3, help="first step in the medians")
    ap.add_argument("--delay", choices=["auto", "relay", "netem"], default="auto",
                    help="where latency and jitter come from (auto: netem if the kernel has it)")
    ap.add_argument("--faults", action="store_true", help="the black-hole runs instead of the table")
    ap.add_argument("--holes", default="5,30", help="seconds of each faulted run, comma-separated")
    ap.add_argument("--fault-at", type=int, default=4, help="the step line that starts the hole")
    ap.add_argument("--fault-steps", type=int, default=14, help="steps of the faulted job")
    ap.add_argument("--fault-profile", default="zone", choices=TOPOLOGIES)
    ap.add_argument("--smoke", action="store_true", help="CI's short check (skips unless root)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a job may take")
    ap.add_argument("--keep", action="store_true", help="keep the logs (printed folder)")
    args = ap.parse_args()
    why = why_not_here()
    if why:
        if args.smoke:
            print(f"bench/cluster.py --smoke: skipped: {why}")
            return 0
        ap.error(why)
    binary = str(Path(args.pipewise).resolve())
    if not Path(binary).is_file():
        ap.error(f"--pipewise {binary}: no such file (cargo build --release -p pipewise-cli)")
    for p in args.profiles.split(","):
        if p not in TOPOLOGIES:
            ap.error(f"--profiles: unknown profile {p!r} ({', '.join(TOPOLOGIES)})")
    try:
        args.pass_ms = tuple(float(x) for x in args.pass_ms.split(","))
        assert len(args.pass_ms) == 3 and all(x > 0 for x in args.pass_ms)
    except (ValueError, AssertionError):
        ap.error(f"--pass-ms: {args.pass_ms!r} is not three positive F,B,W times")
    try:
        args.holes = [float(x) for x in args.holes.split(",")]
    except ValueError:
        ap.error(f"--holes: {args.holes!r} is not comma-separated seconds")
    args.kinds = args.kinds.split(",")
    netem = has_netem()
    if args.delay == "auto":
        args.delay = "netem" if netem else "relay"
    elif args.delay == "netem" and not netem:
        ap.error("--delay netem: this kernel has no netem qdisc")
    # SIGTERM tears down as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    folder = Path(tempfile.mkdtemp(prefix="pipewise-cluster-"))
    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; latency and jitter "
          f"from {'netem' if args.delay == 'netem' else 'pipewise relay'}; bandwidth from htb")
    try:
        if args.smoke:
            return smoke(args, binary, folder)
        if args.faults:
            return 1 if faults(args, binary, folder) else 0
        return 1 if table(args, binary, folder) else 0
    finally:
        if args.keep:
            print(f"logs in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
