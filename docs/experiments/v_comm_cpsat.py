#!/usr/bin/env python3
"""How far can a V schedule go at the V-Half limit with a per-hop communication cost?

An experiment, not part of the build: it asks Google OR-tools' CP-SAT solver
(`pip install ortools`; 9.15 was used) for V-shape schedules of the case where adaptive-v
is still slower than 1F1B (docs/status.md, "Known gaps"): d = 16 workers, seed 000's
Table 5 times (F, B, W = 12.96, 13.22, 9.76 per stage of 1/d, so 6.48, 6.61, 4.88 per
V chunk), a hop between workers of 0.5 F = 6.48, and 9 units of activation memory per
worker (18 chunk activations, each held from its F's start to its W's end, the
accounting of pipewise's simulator). Times are in hundredths, so the model is integral.

    full N HINT.csv SECONDS OUT.csv
        The whole schedule of N microbatches as a CP-SAT model (precedence along each
        microbatch's chain with the hop latency, one pass at a time per worker, a
        cumulative memory limit per worker), started from HINT.csv (a schedule in the form
        `pipewise plan --format csv` writes) and improved for SECONDS; writes the best
        per-worker orders to OUT.csv.

    templates SECONDS P [P ...]
        The `wave` template alone at each period P, solved for SECONDS: its largest sum of
        a worker's two activation lifetimes, the solver's bound on it, and what that costs
        per microbatch in the steady state (at least P, and at least the sum over CAP
        activations: Little's law on the worker's memory).

    periodic K SECONDS RATE [RATE ...]
        Whether any K-periodic V schedule (K microbatches with their own timings, repeated
        every K * RATE) runs at RATE per microbatch: its passes collision-free modulo the
        period on every worker and Little's law on every worker's memory, both necessary.
        INFEASIBLE is a proof that none exists; UNKNOWN means the time ran out.

    greedy P [P ...]
        A one-microbatch template without a solver: each pass at the first free slot of its
        worker's circle of length P after its release, in chain order (W right after its B
        when it can be); prints its largest lifetime sum and what its waves cost per
        microbatch in the steady state.

    wave P N OUT.csv
        A one-microbatch template whose passes do not collide modulo a period P (each
        worker's passes laid on a circle of length P), chosen to minimise the largest sum
        of a worker's two activation lifetimes; microbatches are then put into the slots
        0, P, 2P, ... in order, skipping a slot whenever the next microbatch would take a
        worker over its memory; writes the resulting orders to OUT.csv.

Re-simulate any output with pipewise itself (it checks validity and memory):

    pipewise plan -s csv:OUT.csv --times 12.96,13.22,9.76,6.48

(it prints the makespan and every worker's peak, which must stay at 9 units).

Results (2 CP-SAT workers on 2 cores): `wave 40 32` gives 2269.58; `full 32` from there
reaches 2262.35 after 257 s and 2258.89 after 1500 s (first below 1F1B's 2259.42 at about
1180 s; bound 1765.64), kept as docs/experiments/v_comm_d16_n32.csv. `wave 40 64` gives
3844.54 and `full 64` from there 3834.58 after 1500 s (1F1B: 3798.30; bound 3147.40).

Why n = 64 and 128 are harder than n = 32 (2026-11-25). 1F1B runs 48.09 per microbatch in
its steady state (3798.30 − 2259.42 over 32 microbatches) after 720.6 of fill and drain. A V
microbatch's round trip is at least 812.56 (32 F, 32 B, 60 hops, one W), so at n = 128 a V
schedule must average below about (6876.06 − 812.56) / 127 = 47.7 per microbatch, and below
47.4 at n = 64; only the first ~18 microbatches are free of the memory limit (n = 32 is
won that way: 13 start back to back). `templates 100 40 46 47`: the best one-microbatch
template at period 40 has a lifetime sum of 862.72 and CP-SAT proves it optimal, so its
waves cost at least 47.93 per microbatch (48.1 realised: 9 microbatches every 433.1);
at 46 and 47 one run each (100 s and 150 s) proved bounds of 863.94 and 888.59, so at least
48.0 and 49.4 per microbatch; a later 100 s run of `templates 100 40 46 47` proved only
830.53 and 835.17 there (the two-worker search is not deterministic; every bound it proves
holds) and found no template better than 900.72 and 916.72. At 41–44 the
best templates found in 25–100 s are the period-40 one shifted (the same orders), and at 45
a worse one; their bounds, 833.9–851.7, leave those periods open. A two-microbatch template at period 80 (a variant of `template`,
not kept) found nothing better than two period-40 ones in 120 s (1725.44, bound 1679.56).
The pipewise local search gains nothing on the waves (2269.58, 3844.54, 6915.92).
Without a solver (2026-11-26, `greedy 38 38.5 ... 55.5`, every half unit): the best greedy
template is at period 51, lifetime sum 928.99, so its waves cost at least 51.61 per
microbatch, above adaptive-v's own 49.45; no period below 49 gives under 55. The
construction is therefore not in pipewise: it is the solver's template that makes it good.

Periodic schedules (2026-11-25, `periodic`, 2 workers on 2 cores). The rates that matter:
47.4 and 47.7 per microbatch (what a V schedule must average at n = 64 and 128 to beat 1F1B,
above), and 48.09 (1F1B's own steady state: a V schedule slower than that loses to 1F1B
for every large enough n). Proved INFEASIBLE: K = 1 at every rate up to 49.10 (47.4, 47.7,
48.09, 48.5 and 49.0 in 0.1 s, 49.10 in 15 s; the first feasible rate in steps of 0.01 is
49.12); K = 2 at 47.4, 47.7 and 48.09 (27 s, 72 s, 20 s); K = 3 at 47.4 (298 s) and 47.7
(107 s). UNKNOWN: K = 3 at 48.09 after 900 s; K = 4 at all three after 120 s, and at 47.4 after
2400 s (2026-11-26); K = 5, 6 and
8 at 47.7 after 300 s (an earlier model that capped how long a W may wait after its B proved K = 2 to 4
infeasible quickly, but that cap is not implied by the memory limit, so those results
are not kept). So no V schedule within 9 units that repeats every one or two microbatches
even matches 1F1B's steady state, none that repeats every three reaches the rates n = 64
and 128 need, and longer repeats and schedules that never repeat remain open.
"""

import csv
import sys

from ortools.sat.python import cp_model

D = 16
STAGES = 2 * D
DUR = {"F": 648, "B": 661, "W": 488}
HOP = 648
CAP = 18  # 9 units of 1/d of the model = 18 activations of a half-size chunk
CSV_KIND = {"F": "F", "B": "I", "W": "W"}


def worker(stage):
    return stage if stage < D else STAGES - 1 - stage


def hop(a, b):
    return 0 if worker(a) == worker(b) else HOP


def deps(kind, stage, mb):
    if kind == "F":
        return [] if stage == 0 else [(("F", stage - 1, mb), hop(stage - 1, stage))]
    if kind == "B":
        if stage == STAGES - 1:
            return [(("F", stage, mb), 0)]
        return [(("B", stage + 1, mb), hop(stage + 1, stage))]
    return [(("B", stage, mb), 0)]


def simulate(orders):
    """Runs per-worker orders as soon as possible; returns (start times, makespan)."""
    end, start = {}, {}
    pos, free = [0] * D, [0] * D
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for w in range(D):
            while pos[w] < len(orders[w]):
                p = orders[w][pos[w]]
                ds = deps(*p)
                if any(d not in end for d, _ in ds):
                    break
                t = max([free[w]] + [end[d] + h for d, h in ds])
                start[p], end[p] = t, t + DUR[p[0]]
                free[w] = end[p]
                pos[w] += 1
                left -= 1
                moved = True
        if not moved:
            raise SystemExit("the orders deadlock")
    return start, max(end.values())


def peak(orders):
    """Largest number of live activations on any worker (memory follows the order)."""
    top = 0
    for order in orders:
        live = 0
        for kind, _, _ in order:
            live += kind == "F"
            top = max(top, live)
            live -= kind == "W"
    return top


def read_csv(path):
    orders = []
    for row in csv.reader(open(path)):
        order = []
        for cell in (c.strip() for c in row):
            if not cell:
                continue
            i = 0
            while cell[i].isdigit():
                i += 1
            kind = {"I": "B"}.get(cell[i], cell[i])
            order.append((kind, int(cell[:i]), int(cell[i + 1 :])))
        orders.append(order)
    return orders


def write_csv(path, orders):
    with open(path, "w") as f:
        for order in orders:
            f.write(",".join(f"{s}{CSV_KIND[k]}{m}" for k, s, m in order) + "\n")


def orders_of(times):
    """Per-worker orders of a timed schedule {(kind, stage, mb): start}."""
    rows = [[] for _ in range(D)]
    for p, t in times.items():
        rows[worker(p[1])].append((t, p))
    return [[p for _, p in sorted(r)] for r in rows]


def chain(m, t, mbs):
    for mb in mbs:
        for s in range(1, STAGES):
            m.Add(t[("F", s, mb)] >= t[("F", s - 1, mb)] + DUR["F"] + hop(s - 1, s))
        m.Add(t[("B", STAGES - 1, mb)] >= t[("F", STAGES - 1, mb)] + DUR["F"])
        for s in range(STAGES - 1):
            m.Add(t[("B", s, mb)] >= t[("B", s + 1, mb)] + DUR["B"] + hop(s + 1, s))
        for s in range(STAGES):
            m.Add(t[("W", s, mb)] >= t[("B", s, mb)] + DUR["B"])


class Progress(cp_model.CpSolverSolutionCallback):
    def on_solution_callback(self):
        print(
            f"{self.WallTime():7.1f} s: makespan {self.ObjectiveValue() / 100:.2f}, "
            f"bound {self.BestObjectiveBound() / 100:.2f}",
            flush=True,
        )


def full(n, hint_path, seconds, out):
    horizon = 1_000_000
    m = cp_model.CpModel()
    t = {
        (k, s, mb): m.NewIntVar(0, horizon, f"{k}{s}_{mb}")
        for mb in range(n)
        for s in range(STAGES)
        for k in "FBW"
    }
    chain(m, t, range(n))
    per_worker = [[] for _ in range(D)]
    for (k, s, mb), v in t.items():
        per_worker[worker(s)].append(m.NewFixedSizeIntervalVar(v, DUR[k], ""))
    for ivs in per_worker:
        m.AddNoOverlap(ivs)
    for w in range(D):
        lives = []
        for s in (w, STAGES - 1 - w):
            for mb in range(n):
                end = m.NewIntVar(0, horizon, "")
                m.Add(end == t[("W", s, mb)] + DUR["W"])
                size = m.NewIntVar(0, horizon, "")
                lives.append(m.NewIntervalVar(t[("F", s, mb)], size, end, ""))
        m.AddCumulative(lives, [1] * len(lives), CAP)
    makespan = m.NewIntVar(0, horizon, "makespan")
    for (k, s, mb), v in t.items():
        if k == "W":
            m.Add(makespan >= v + DUR["W"])
    # Microbatches are interchangeable: number them in the order they enter stage 0.
    for mb in range(n - 1):
        m.Add(t[("F", 0, mb)] <= t[("F", 0, mb + 1)])
    m.Minimize(makespan)
    start, hint_makespan = simulate(read_csv(hint_path))
    order = sorted(range(n), key=lambda mb: start[("F", 0, mb)])
    renumber = {old: new for new, old in enumerate(order)}
    for (k, s, mb), v in start.items():
        m.AddHint(t[(k, s, renumber[mb])], v)
    m.AddHint(makespan, hint_makespan)
    print(f"hint: makespan {hint_makespan / 100:.2f}", flush=True)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 2
    status = solver.Solve(m, Progress())
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SystemExit(solver.StatusName(status))
    orders = orders_of({p: solver.Value(v) for p, v in t.items()})
    _, best = simulate(orders)
    print(f"{solver.StatusName(status)}: makespan {best / 100:.2f}, peak {peak(orders)}")
    write_csv(out, orders)


def template(period, seconds=30):
    """One microbatch's timing, collision free modulo `period` (hundredths)."""
    m = cp_model.CpModel()
    horizon = 200_000
    t = {(k, s, 0): m.NewIntVar(0, horizon, "") for s in range(STAGES) for k in "FBW"}
    chain(m, t, [0])
    m.Add(t[("F", 0, 0)] == 0)
    for w in range(D):
        ivs = []
        for s in (w, STAGES - 1 - w):
            for k in "FBW":
                laps = m.NewIntVar(0, horizon // period + 1, "")
                phase = m.NewIntVar(0, period - 1, "")
                m.Add(t[(k, s, 0)] == phase + period * laps)
                # A circle of length `period` laid out twice, so wrapping passes collide too.
                ivs.append(m.NewFixedSizeIntervalVar(phase, DUR[k], ""))
                again = m.NewIntVar(period, 2 * period, "")
                m.Add(again == phase + period)
                ivs.append(m.NewFixedSizeIntervalVar(again, DUR[k], ""))
        m.AddNoOverlap(ivs)
    worst = m.NewIntVar(0, horizon, "")
    for w in range(D):
        a, b = w, STAGES - 1 - w
        m.Add(
            worst
            >= t[("W", a, 0)] - t[("F", a, 0)] + t[("W", b, 0)] - t[("F", b, 0)] + 2 * DUR["W"]
        )
    m.Minimize(worst)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 2
    if solver.Solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SystemExit(f"no template at period {period / 100}")
    worst_sum, bound = solver.Value(worst) / 100, solver.BestObjectiveBound() / 100
    # Every slot holds a microbatch only if the lifetimes fit the memory on average
    # (CAP activations per period); otherwise slots are skipped and a microbatch costs at
    # least worst / CAP, and every template at this period at least bound / CAP.
    print(
        f"template at period {period / 100}: largest lifetime sum {worst_sum:.2f} "
        f"(bound {bound:.2f}); per microbatch at least {max(period / 100, worst_sum / CAP):.2f} "
        f"with it, {max(period / 100, bound / CAP):.2f} with any",
        flush=True,
    )
    return {(k, s): solver.Value(v) for (k, s, _), v in t.items()}


def wave(period, n, out):
    tm = template(period)
    slots, slot = [], 0
    while len(slots) < n:
        trial = slots + [slot]
        times = {(k, s, mb): x + at * period for mb, at in enumerate(trial) for (k, s), x in tm.items()}
        if peak(orders_of(times)) <= CAP:
            slots = trial
        slot += 1
    times = {(k, s, mb): x + at * period for mb, at in enumerate(slots) for (k, s), x in tm.items()}
    orders = orders_of(times)
    _, makespan = simulate(orders)
    print(f"{n} microbatches in {slots[-1] + 1} slots: makespan {makespan / 100:.2f}, peak {peak(orders)}")
    write_csv(out, orders)


def releases():
    """Each pass's earliest start in one microbatch's chain when nothing waits (hundredths;
    a W right after its B)."""
    at, t = {}, 0
    for s in range(STAGES):
        t += DUR["F"] + hop(s - 1, s) if s else 0
        at[("F", s)] = t
    t += DUR["F"]
    for s in range(STAGES - 1, -1, -1):
        t += DUR["B"] + hop(s + 1, s) if s < STAGES - 1 else 0
        at[("B", s)] = t
        at[("W", s)] = t + DUR["B"]
    return at


def min_lifetime_sum(w=0):
    """Worker w's two activation lifetimes when nothing waits (each from its F's start to
    its W's end); 830.53 on worker 0, whose stage 0 spans the whole round trip."""
    at = releases()
    return sum(at[("W", s)] + DUR["W"] - at[("F", s)] for s in (w, STAGES - 1 - w))


def periodic(k, per, seconds):
    """Is there a k-periodic V schedule at `per` hundredths per microbatch?

    Microbatches j = 0..k-1 of each period of length Q = k * per get their own timing;
    microbatch j + m*k runs at j's times plus m*Q. Every worker's passes of the k
    microbatches must not overlap modulo Q, and Little's law must hold on every worker's
    memory: the sum of the k microbatches' activation lifetimes on its two stages is at
    most CAP * Q (CAP live activations on average). Both are necessary for any k-periodic
    schedule within the limit, so INFEASIBLE proves that none exists at this rate.
    Returns the solver's status name."""
    q_len = k * per
    # Every wait on a microbatch's chain, or of a W after its B, lengthens its worker's
    # lifetimes by as much, and every microbatch's lifetimes on worker 0 are at least the
    # floor: no timing waits longer than this in all.
    budget = max(0, CAP * q_len - k * min_lifetime_sum())
    at = releases()
    m = cp_model.CpModel()
    t, bounds = {}, {}
    for j in range(k):
        for (kind, s), r in at.items():
            # The microbatch starts within the period; then only waits delay it. A W may
            # also wait after its B for as long as its worker's memory allows.
            late = r + q_len + budget
            if kind == "W":
                late += max(0, CAP * q_len - k * min_lifetime_sum(worker(s)))
            bounds[(kind, s, j)] = (r, late)
            t[(kind, s, j)] = m.NewIntVar(r, late, "")
    m.Add(t[("F", 0, 0)] == 0)
    for j in range(1, k):
        m.Add(t[("F", 0, j)] >= t[("F", 0, j - 1)])
    chain(m, t, range(k))
    for w in range(D):
        passes = [(kind, s, j) for j in range(k) for s in (w, STAGES - 1 - w) for kind in "FBW"]
        for a in range(len(passes)):
            for b in range(a + 1, len(passes)):
                pa, pb = passes[a], passes[b]
                lo = bounds[pb][0] - bounds[pa][1]
                hi = bounds[pb][1] - bounds[pa][0]
                # start(b) - start(a) = laps * Q + r with r in [dur(a), Q - dur(b)]: the
                # two passes are apart on the circle of length Q.
                laps = m.NewIntVar(lo // q_len - 1, hi // q_len + 1, "")
                r = m.NewIntVar(DUR[pa[0]], q_len - DUR[pb[0]], "")
                m.Add(t[pb] - t[pa] == laps * q_len + r)
        lives = [
            t[("W", s, j)] + DUR["W"] - t[("F", s, j)]
            for j in range(k)
            for s in (w, STAGES - 1 - w)
        ]
        m.Add(sum(lives) <= CAP * q_len)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 2
    status = solver.StatusName(solver.Solve(m))
    print(f"k = {k}, {per / 100:.2f} per microbatch: {status} in {solver.WallTime():.1f} s", flush=True)
    return status

def greedy_template(period):
    """One microbatch's timing with every pass at the first start, from its release, whose
    slot on its worker's circle of length `period` is free (W right after its B when it
    can be); `None` when a pass finds no free slot within one lap."""
    circle = [[] for _ in range(D)]
    t = {}

    def free(w, x, dur):
        a = x % period
        return all(
            not (a < s + off + length and s + off < a + dur)
            for s, length in circle[w]
            for off in (-period, 0, period)
        )

    def place(p, ready):
        w, dur, x = worker(p[1]), DUR[p[0]], ready
        while not free(w, x, dur):
            x += 1
            if x - ready > period:
                return False
        circle[w].append((x % period, dur))
        t[p] = x
        return True

    for s in range(STAGES):
        if not place(("F", s), 0 if s == 0 else t[("F", s - 1)] + DUR["F"] + hop(s - 1, s)):
            return None
    for s in range(STAGES - 1, -1, -1):
        ready = (
            t[("F", s)] + DUR["F"]
            if s == STAGES - 1
            else t[("B", s + 1)] + DUR["B"] + hop(s + 1, s)
        )
        if not place(("B", s), ready) or not place(("W", s), t[("B", s)] + DUR["B"]):
            return None
    return t


def greedy(periods):
    """`greedy_template` at each period: its largest sum of a worker's two lifetimes and
    the steady-state cost per microbatch of its waves (at least the period, and at least
    that sum over CAP)."""
    for period in periods:
        tm = greedy_template(period)
        if tm is None:
            print(f"greedy template at period {period / 100}: none", flush=True)
            continue
        worst = max(
            tm[("W", a)] - tm[("F", a)] + tm[("W", b)] - tm[("F", b)] + 2 * DUR["W"]
            for a, b in ((w, STAGES - 1 - w) for w in range(D))
        )
        print(
            f"greedy template at period {period / 100}: largest lifetime sum {worst / 100:.2f}, "
            f"per microbatch at least {max(period, worst / CAP) / 100:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["templates", seconds, *periods] if periods:
            for p in periods:
                template(int(round(float(p) * 100)), float(seconds))
        case ["full", n, hint, seconds, out]:
            full(int(n), hint, float(seconds), out)
        case ["periodic", k, seconds, *rates] if rates:
            for rate in rates:
                periodic(int(k), int(round(float(rate) * 100)), float(seconds))
        case ["greedy", *periods] if periods:
            greedy([int(round(float(p) * 100)) for p in periods])
        case ["wave", period, n, out]:
            wave(int(round(float(period) * 100)), int(n), out)
        case _:
            raise SystemExit(__doc__)
