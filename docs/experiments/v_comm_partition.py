#!/usr/bin/env python3
"""Would another layer split help a V schedule at the V-Half limit with a per-hop cost?

An experiment, not part of the build (`pip install scipy numpy`). The case is the known gap
of docs/status.md ("Known gaps"): d = 16 workers, seed 000's Table 5 times per stage
of 1/d of the model (F + B = 26.18, W = 9.76), a hop of 6.48 between workers, 9 units of
activation memory per worker. 1F1B reaches 48.09 per microbatch there.

Little's law on worker w: its activations held per microbatch, integrated over time (the
memory-time M_w), divided by the limit, bounds the steady-state period from below. With
worker w holding a share s_w of the model (s_w = 1/d for the even split) of which a fraction
a_w sits in its first V chunk (stage w) and 1 - a_w in its second (stage 2d - 1 - w), and
every microbatch crossing the V without waiting:

    L_first(w)  = F+B of stages w .. 2d-1 + 2 (2d - 2 - w) hops + W of stage w
    L_second(w) = F+B of stages 2d-1-w .. 2d-1 + 2 w hops + W of stage 2d-1-w
    M_w         = d s_w (a_w L_first(w) + (1 - a_w) L_second(w))      [units x time]
    period     >= max_w max(M_w / limit, d s_w (F + B + W))

It prints the bound for the even split (46.14), the best split of each worker's layers
between its two chunks with even shares (SLSQP: the even split itself), and the best over
shares and splits together (40.87, compute-bound on the first workers). The last is only a
bound: pipewise's adaptive-v plans those stage costs 15 to 27 % slower than 1F1B at
n = 32 ... 128 (the even split: 3 %), and mixes of them with the even split (10 % of the way
and more) 7 % slower or worse; the uneven chunks wait more than the even ones. To re-plan
them, write the stage costs with `--write FILE` and run

    pipewise plan -s adaptive-v -d 16 -n 32 --stage-times FILE \
        --times 12.96,13.22,9.76,6.48 --memory-limit 9

(`--mix T` writes the partition T of the way from the even split to the best one.)
"""

import sys

import numpy as np
from scipy.optimize import minimize

D = 16
FB = 12.96 + 13.22
W = 9.76
HOP = 6.48
LIMIT = 9.0
TOTAL = FB + W


def memory_time(split, share):
    """M_w for every worker; `share` in units of 1/d (1.0 each for the even split)."""
    out = []
    for w in range(D):
        first = [share[k] * split[k] * FB for k in range(D)]
        second = [share[k] * (1 - split[k]) * FB for k in range(D)]
        l_first = sum(first[w:]) + sum(second) + 2 * (2 * D - 2 - w) * HOP
        l_first += share[w] * split[w] * W
        l_second = sum(second[: w + 1]) + 2 * w * HOP + share[w] * (1 - split[w]) * W
        out.append(share[w] * (split[w] * l_first + (1 - split[w]) * l_second))
    return np.array(out)


def bound(split, share):
    return max(memory_time(split, share).max() / LIMIT, max(share) * TOTAL)


def best(free_shares):
    """Minimise the period bound; x = splits, shares (if free), period."""
    n = 2 * D if free_shares else D

    def parts(x):
        share = x[D : 2 * D] if free_shares else np.ones(D)
        return x[:D], share, x[n]

    def constraints(x):
        split, share, period = parts(x)
        c = [period * LIMIT - memory_time(split, share), period - share * TOTAL]
        if free_shares:
            c.append([D - share.sum(), share.sum() - D])
        return np.concatenate(c)

    found = None
    for seed in range(4):
        rng = np.random.default_rng(seed)
        x0 = list(0.5 + 0.05 * rng.standard_normal(D))
        if free_shares:
            x0 += list(1 + 0.05 * rng.standard_normal(D))
        x0 = np.array(x0 + [60.0])
        bounds = [(0.05, 0.95)] * D + ([(0.01, 4.0)] * D if free_shares else []) + [(0, 1e4)]
        r = minimize(
            lambda x: x[n],
            x0,
            constraints=[{"type": "ineq", "fun": constraints}],
            bounds=bounds,
            method="SLSQP",
            options={"maxiter": 2000},
        )
        if r.success and (found is None or r.x[n] < found[2]):
            found = parts(r.x)
    return found


def stage_lines(split, share):
    """`--stage-times` lines (f,b,w,mem) of the 2d stages, in stage order."""
    lines = []
    for stage in range(2 * D):
        w = stage if stage < D else 2 * D - 1 - stage
        part = share[w] * (split[w] if stage < D else 1 - split[w])
        lines.append(f"{12.96 * part:.6f},{13.22 * part:.6f},{9.76 * part:.6f},{part:.6f}")
    return "\n".join(lines) + "\n"


def main():
    args = sys.argv[1:]
    out = args[args.index("--write") + 1] if "--write" in args else None
    mix = float(args[args.index("--mix") + 1]) if "--mix" in args else 1.0
    even = np.full(D, 0.5)
    print(f"even split, even shares: period >= {bound(even, np.ones(D)):.2f}")
    split, share, period = best(free_shares=False)
    print(f"best split, even shares: period >= {period:.2f}, splits {np.round(split, 3)}")
    split, share, period = best(free_shares=True)
    print(f"best split and shares:   period >= {period:.2f}")
    print(f"  splits {np.round(split, 3)}")
    print(f"  shares {np.round(share, 3)} (x 1/d)")
    if out:
        split = 0.5 + mix * (split - 0.5)
        share = 1 + mix * (share - 1)
        share = share * D / share.sum()
        with open(out, "w") as f:
            f.write(stage_lines(split, share))
        print(f"wrote {out} (mix {mix}: period >= {bound(split, share):.2f})")


if __name__ == "__main__":
    main()
