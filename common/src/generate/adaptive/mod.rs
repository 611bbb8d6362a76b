//! Memory-budget planning: the adaptive V-shape scheduler (seed 000, App. A and B) and the
//! adaptive zero-bubble scheduler for one stage per worker (the ZB-1P / ZB-2P family).
//!
//! # Adaptive V
//!
//! The search space is Eq. 3 of seed 000: the building block's "down" offsets (F on the
//! first half of the V, B on the second half) are `down_lo` between the first `K` workers and
//! `down_hi` from there on; the "up" offsets (F on the second half, B on the first) likewise
//! `up_lo` / `up_hi`; three turn offsets fix the pass order on the first and last worker.
//! Every F, B and W takes one cell and the block repeats every `T = 6` cells.
//!
//! 1. **Enumerate** every offset tuple and keep the collision-free ones. Collisions are
//!    checked in closed form: on worker `i` the F⁰, F¹, B¹ and B⁰ cells are sums of prefix
//!    offsets, so a tuple collides iff two of them share a residue modulo `T`; the W passes
//!    take the two residues left (App. A: "we can always greedily fill W").
//! 2. **Memory estimate** (Eq. 1 with the true per-stage memory): each stage holds
//!    `⌈lifespan / T⌉` microbatches at most. This is an upper bound of the repeated order's
//!    peak, so a tuple whose estimate fits the limit certainly fits.
//! 3. **Proxy**: the distinct repeated orders are simulated with the true costs at two small
//!    microbatch counts and the makespan at `n` is extrapolated linearly.
//! 4. **Full evaluation** of the best few, and of every block that is among the best few of
//!    the blocks of its own peak or less (as the budget allows: so that a larger limit
//!    evaluates what a smaller one does): repeat to `n`, squeeze, reorder the warm-up and
//!    the cool-down (App. C), compact and fill W passes within the limit and, as the budget
//!    allows, within the block's own peak ([`super::finish`]), then the local search of
//!    [`super::local`]. The fixed V-Min / V-Half / V-ZB blocks are
//!    always evaluated too when they fit, and on small shapes (up to `ALWAYS_FIXED`
//!    passes) so are the fixed schedules themselves as the paper builds them
//!    ([`super::paper_v`]: their W filling and, for V-ZB, the greedy V scheduler), so the
//!    result is never worse than the paper's schedule of the same memory class under the
//!    same costs: never a longer makespan, and on equal makespans never a higher span bubble
//!    (the named V schedules, [`super::fixed_v`], are in turn the better of that and this
//!    search at their class's limit).
//! 5. **List scheduling** ([`super::list_v`]): passes placed one at a time in time order
//!    with the true costs and hop latency, over a grid of start rates, bursts, W policies
//!    and memory reserves refined by pattern search, as many runs as `LIST_BUDGET`
//!    allows. Blocks repeat one timing for every microbatch, which costs the most when hops
//!    are long and `n` is small; there a non-periodic fill wins (e.g. d = 16, hops of half
//!    an F, 9 units, n = 16: 1470.2 against the best block's 1542.3 and 1F1B's 1490.0; 10
//!    units, n = 32: 2241.1 against 2267.7 and 2259.4). The best of 4 and 5 (least
//!    makespan, then least span bubble) goes to the local search, which lowers the makespan,
//!    then the span bubble; on small shapes (up to 4096 passes) the best three distinct
//!    schedules each go to it, and the best result wins (where the search ends depends on
//!    where it starts).
//!
//! # Adaptive zero bubble
//!
//! One stage per worker with the B/W split: worker `w` runs `warm(w)` forwards before its
//! first backward, from `min(d − w − 1, c)` (below 1F1B's memory) through 1F1B (`d − w − 1`)
//! to ZB-H2 (`2(d − w − 1)`); W passes then fill the bubbles within the limit
//! ([`super::fill_weights`]; also within the shape's own peak when the budget allows) and
//! the local search runs (from the best three on small shapes). The least makespan that
//! fits wins.
//! On large shapes (above `ZB_FULL_BUDGET` passes in all) the warm-ups are ranked by a
//! proxy (the order as repeated, or with lazy W filling) and only the best are finished.
//!
//! # Files
//!
//! - `offsets`: the V search space (Eq. 3) and its collision-free tuples;
//! - `estimate`: a block's peak and makespan without building its schedule;
//! - `search`: what both searches share (comparison, local-search starts, the end);
//! - `v`: [`adaptive_v`];
//! - `zb`: [`adaptive_zb`].

mod estimate;
mod offsets;
mod search;
mod v;
mod zb;

pub use estimate::{block_makespan, order_peak, steady_peak};
pub use offsets::{SplitOffsets, split_candidates};
pub use search::{Bounds, LOCAL_SEARCH_BUDGET, Planned};
pub use v::adaptive_v;
pub(crate) use v::adaptive_v_knowing;
pub use zb::adaptive_zb;
