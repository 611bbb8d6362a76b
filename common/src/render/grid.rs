//! A text timeline: one row per worker, one cell per time quantum.
//!
//! Time is quantised to the shortest pass of the simulation, so a unit-time schedule shows
//! one cell per pass; when passes are so uneven that this would give a row more than
//! [`MAX_CELLS`] cells, the quantum grows to the makespan over [`MAX_CELLS`]. A pass fills `round(duration / quantum)` cells (at least one): its text
//! (`0F3`, `1B0`, `2W5`, `0BW1`, pipewise's own pass text) in the first, `-` in the others.
//! Idle cells are `.`. A pass shorter than half a cell (e.g. a zero-time W) still gets one
//! cell, which shifts the rest of its row right: the grid is exact for unit-time schedules
//! and approximate otherwise.

use crate::schedule::Schedule;
use crate::simulate::Simulation;

use super::{first_start, shortest_pass};

/// The most cells a row gets from time alone (a pass of zero time still takes one).
pub const MAX_CELLS: f64 = 100_000.0;

/// The duration of one grid cell: the shortest pass of `sim`, or the span of the timeline
/// over [`MAX_CELLS`] if that is longer.
pub fn quantum(sim: &Simulation) -> f64 {
    let span = sim.makespan - first_start(sim);
    shortest_pass(sim).max(span / MAX_CELLS)
}

/// Renders the grid: exactly one line per worker, `worker W | cells…`.
pub fn grid(schedule: &Schedule, sim: &Simulation) -> String {
    let q = quantum(sim);
    let t0 = first_start(sim);
    let width = sim
        .timeline
        .iter()
        .flatten()
        .map(|t| t.pass.to_string().len())
        .max()
        .unwrap_or(1);
    let label_width = schedule.num_workers().saturating_sub(1).to_string().len();
    let mut out = String::new();
    for (w, line) in sim.timeline.iter().enumerate() {
        let mut cells: Vec<String> = Vec::new();
        for timed in line {
            let start = ((timed.start - t0) / q).round().max(0.0) as usize;
            let span = ((timed.end - timed.start) / q).round().max(1.0) as usize;
            // Rounding never lets a pass overlap the one before it.
            let start = start.max(cells.len());
            while cells.len() < start {
                cells.push(format!("{:<width$}", "."));
            }
            cells.push(format!("{:<width$}", timed.pass.to_string()));
            for _ in 1..span {
                cells.push("-".repeat(width));
            }
        }
        let row = cells.join(" ");
        out.push_str(&format!("worker {w:>label_width$} | {}", row.trim_end()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{Costs, Times};
    use crate::generate::{Request, ScheduleKind, generate};
    use crate::simulate::simulate;

    fn planned(kind: ScheduleKind, d: u32, n: u32) -> (Schedule, Simulation) {
        let s = generate(&Request::new(kind, d, n)).expect("generates");
        let costs = Costs::uniform(&s.placement, Times::UNIT).expect("costs");
        let sim = simulate(&s, &costs).expect("simulates");
        (s, sim)
    }

    #[test]
    fn one_row_per_worker_one_cell_per_unit() {
        let (s, sim) = planned(ScheduleKind::OneFOneB, 2, 2);
        let text = grid(&s, &sim);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert_eq!(
            text,
            "worker 0 | 0F0  0F1  .    .    0BW0 ---- .    0BW1 ----\n\
             worker 1 | .    1F0  1BW0 ---- 1F1  1BW1 ----\n"
        );
    }

    #[test]
    fn d_rows_for_every_kind() {
        for kind in [
            ScheduleKind::VHalf,
            ScheduleKind::ZbH1,
            ScheduleKind::Interleaved1F1B,
        ] {
            let (s, sim) = planned(kind, 4, 8);
            let text = grid(&s, &sim);
            assert_eq!(text.lines().count(), 4, "{kind}\n{text}");
            assert!(text.lines().all(|l| l.starts_with("worker ")), "{text}");
            // Every pass shows up once.
            let shown = text
                .split_whitespace()
                .filter(|c| c.starts_with(|ch: char| ch.is_ascii_digit()))
                .filter(|c| c.contains(|ch: char| ch.is_ascii_alphabetic()))
                .count();
            assert_eq!(shown, s.num_passes(), "{kind}\n{text}");
        }
    }

    /// Very uneven pass times coarsen the grid instead of drawing one cell per shortest
    /// pass (F of 1e-9 against B and W of 1 asked for gigabytes).
    #[test]
    fn uneven_times_keep_the_grid_bounded() {
        let schedule = generate(&Request::new(ScheduleKind::ZbH1, 4, 8)).expect("generates");
        let times = Times {
            f: 1e-9,
            b: 1.0,
            w: 1.0,
            comm: 0.0,
        };
        let costs = Costs::uniform(&schedule.placement, times).expect("costs");
        let sim = simulate(&schedule, &costs).expect("simulates");
        let text = grid(&schedule, &sim);
        assert_eq!(text.lines().count(), 4);
        // Cells are 3 characters and a space here ("0F0 ", "--- ", ".   ").
        let longest = text.lines().map(str::len).max().unwrap_or(0);
        assert!(
            longest as f64 <= 4.0 * (MAX_CELLS + 200.0),
            "{longest} characters"
        );
        assert!(
            longest as f64 >= 4.0 * 0.9 * MAX_CELLS,
            "{longest} characters"
        );
        assert!(quantum(&sim) > 1e-9);
    }
}
