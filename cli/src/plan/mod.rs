//! `pipewise plan`: generate or import, simulate, then report or render.
//!
//! [`args`] defines the flags as typed, [`request`] checks them together into a [`Plan`],
//! [`stage_times`] reads `--stage-times`, [`auto`] is `--auto` (the auto-planner's flags and
//! report); this file runs the checked request.

pub(crate) mod args;
mod auto;
mod request;
mod stage_times;

use std::io::Write as _;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use pipewise_common::csv::{from_csv, to_csv};
use pipewise_common::generate::generate_with;
use pipewise_common::render::curve::{Series, line_chart};
use pipewise_common::render::report::{Report, compare_table, fmt_bytes};
use pipewise_common::render::{chrome, grid, svg};
use pipewise_common::schedule::{Recompute, RecomputeShares};
use pipewise_common::{
    Costs, Error, Placement, Request, Schedule, ScheduleKind, Simulation, StageCost, simulate,
};

use self::args::{Format, PlanArgs};
use self::request::{Plan, Source};
use crate::text_file::read_text;

/// Runs `pipewise plan`: checks the arguments, plans, and writes the output.
pub(crate) fn run(args: PlanArgs) -> Result<()> {
    run_plan(&args.resolve()?)
}

/// Runs the checked plan and writes its output.
fn run_plan(plan: &Plan) -> Result<()> {
    let text = match &plan.source {
        Source::Generate {
            kind,
            workers,
            microbatches,
            chunks,
        } if plan.sweep_memory => sweep(plan, *kind, *workers, *microbatches)?,
        Source::Generate {
            kind,
            workers,
            microbatches,
            chunks,
        } => {
            let start = Instant::now();
            let request = request(plan, *kind, *workers, *microbatches, *chunks)?;
            let mut schedule = generate_planned(plan, &request)
                .map_err(|e| in_bytes(e, plan.activation_bytes))
                .with_context(|| {
                    format!(
                        "cannot plan {kind} with --workers {workers} --microbatches {microbatches}"
                    )
                })?;
            schedule.name = recomputing_name(plan, &schedule.name);
            render(plan, &schedule, start)?
        }
        Source::Csv {
            path,
            workers,
            microbatches,
        } => {
            let text = read_text(path, MAX_CSV_BYTES)
                .with_context(|| format!("--schedule csv:{}", path.display()))?;
            let start = Instant::now();
            let name = format!("csv:{}", path.display());
            let mut schedule = from_csv(&text, &name)
                .with_context(|| format!("--schedule {name}: not a valid schedule"))?;
            schedule.name = recomputing_name(plan, &schedule.name);
            if let Some(d) = workers
                && *d != schedule.num_workers()
            {
                bail!(
                    "--workers {d} does not match {name}, which has {} rows (workers)",
                    schedule.num_workers()
                );
            }
            if let Some(n) = microbatches
                && *n != schedule.microbatches
            {
                bail!(
                    "--microbatches {n} does not match {name}, which has {} microbatches",
                    schedule.microbatches
                );
            }
            render(plan, &schedule, start)?
        }
        Source::Compare {
            workers,
            microbatches,
            chunks,
        } => compare(plan, *workers, *microbatches, *chunks)?,
        Source::Auto { workers, args } => auto::run_auto(
            args,
            *workers,
            plan.times.comm,
            plan.auto_recompute,
            plan.format == Format::Json,
        )?,
    };
    write_output(plan, &text)
}

/// The largest CSV schedule read: 2M stage-microbatches of three actions, at up to about 40
/// bytes a cell, is well within it.
const MAX_CSV_BYTES: u64 = 256 << 20;

/// The generator request. Its times are only checked: every cost-aware step gets the plan's
/// cost model (`--stage-times` or `--times`) through [`generate_planned`].
fn request(plan: &Plan, kind: ScheduleKind, d: u32, n: u32, chunks: u32) -> Result<Request> {
    let times = plan.times;
    let peak = || one_f_one_b_peak(plan, &kind.placement(d, chunks));
    let memory_limit = match plan.memory_limit {
        // The fixed kinds have a fixed memory class (`--compare` gives them no limit).
        Some(_) if !kind.is_adaptive() => None,
        Some(limit) => Some(limit.units(peak, plan.activation_bytes)?),
        // The adaptive kinds' default, 1x 1F1B's peak (the generators' own default, d
        // units, is the same unless --stage-times gives stage memory; kept when the stages
        // hold no memory at all, where any limit fits).
        None if matches!(kind, ScheduleKind::AdaptiveV | ScheduleKind::AdaptiveZb) => {
            Some(peak()?).filter(|p| *p > 0.0)
        }
        None => None,
    };
    Ok(Request {
        kind,
        workers: d,
        microbatches: n,
        chunks,
        times,
        memory_limit,
    })
}

/// Generates with the plan's cost model (`--stage-times` or `--times`) for every cost-aware
/// step, so the adaptive kinds search with the true per-stage costs.
fn generate_planned(plan: &Plan, request: &Request) -> pipewise_common::Result<Schedule> {
    generate_with(request, &|placement| {
        costs(plan, placement).map_err(|e| Error::InvalidArgument {
            field: "stage times",
            reason: format!("{e:#}"),
        })
    })
}

/// A memory-limit error with the limits in bytes too, when a unit's bytes are known
/// (`--activation-bytes`).
fn in_bytes(e: Error, unit_bytes: Option<f64>) -> anyhow::Error {
    match (&e, unit_bytes) {
        (
            Error::MemoryLimit {
                limit, smallest, ..
            },
            Some(unit),
        ) => {
            // The smallest in whole bytes, rounded up: a rounded figure typed back could
            // be below it.
            let least = (smallest * unit).ceil();
            let (limit, smallest) = (fmt_bytes(limit * unit), fmt_bytes(least));
            anyhow::Error::from(e).context(format!(
                "{limit} is below the smallest memory limit that fits, {smallest} \
                 ({least} bytes)"
            ))
        }
        _ => e.into(),
    }
}

/// `--sweep-memory`: bubble against the memory limit, from the smallest limit that fits to
/// twice 1F1B's peak.
fn sweep(plan: &Plan, kind: ScheduleKind, d: u32, n: u32) -> Result<String> {
    let base = request(plan, kind, d, n, 2)?;
    let one_f_one_b = one_f_one_b_peak(plan, &kind.placement(d, 2))?;
    if one_f_one_b <= 0.0 {
        bail!("--sweep-memory: the stages hold no activation memory, so every limit fits");
    }
    // A limit far below any schedule's peak, on the scale of the stages' memory (a fixed
    // 1e-6 was above the smallest fit when the stages' memory was given as 1e-7).
    let probe = one_f_one_b * 1e-9;
    let tiny = Request {
        memory_limit: Some(probe),
        ..base
    };
    let smallest = match generate_planned(plan, &tiny) {
        Err(Error::MemoryLimit { smallest, .. }) => smallest,
        Err(e) => return Err(e).context(format!("cannot plan {kind}")),
        Ok(_) => probe,
    };
    let top = 2.0 * one_f_one_b;
    let steps = 32;
    let mut points: Vec<(f64, Simulation)> = Vec::new();
    let mut limits: Vec<f64> = (0..=steps)
        .map(|i| smallest + (top - smallest) * f64::from(i) / f64::from(steps))
        .collect();
    // Whole and half units too, so the class limits show up exactly: the finest of half,
    // whole and ten units that adds at most MAX_UNIT_ROWS rows (memory given in bytes or
    // other large units would otherwise ask for millions).
    const MAX_UNIT_ROWS: f64 = 256.0;
    if let Some(step) = [0.5, 1.0, 10.0]
        .into_iter()
        .find(|step| (top - smallest) / step <= MAX_UNIT_ROWS)
    {
        let mut u = (smallest / step).ceil() * step;
        while u <= top {
            limits.push(u);
            u += step;
        }
    }
    limits.sort_by(f64::total_cmp);
    limits.dedup_by(|a, b| (*a - *b).abs() < 1e-9 * top);
    for limit in limits {
        let req = Request {
            memory_limit: Some(limit),
            ..base
        };
        let schedule = generate_planned(plan, &req)
            .with_context(|| format!("cannot plan {kind} at memory limit {limit}"))?;
        let sim = simulate_with(plan, &schedule)?;
        // A schedule that fits a smaller limit fits this one too: the sweep keeps the best so
        // far, so its curve never rises even where the search's proxy ranking would.
        let carried = points
            .last()
            .filter(|(_, prev)| prev.makespan < sim.makespan)
            .map(|(_, prev)| prev.clone());
        points.push((limit, carried.unwrap_or(sim)));
    }
    let unit_bytes = plan.activation_bytes;
    Ok(match plan.format {
        Format::Svg => {
            let curve = |f: fn(&Simulation) -> f64| -> Vec<(f64, f64)> {
                points
                    .iter()
                    .map(|(l, s)| (l / one_f_one_b, 100.0 * f(s)))
                    .collect()
            };
            line_chart(
                &format!("{kind}: bubble against memory limit (d={d}, n={n})"),
                "memory limit / 1F1B peak",
                "bubble %",
                &[
                    Series {
                        name: "bubble_span (paper)".into(),
                        points: curve(|s| s.bubble_span),
                    },
                    Series {
                        name: "bubble (all workers)".into(),
                        points: curve(|s| s.bubble),
                    },
                ],
            )
        }
        Format::Json => {
            let rows: Vec<serde_json::Value> = points
                .iter()
                .map(|(l, s)| {
                    serde_json::json!({
                        "limit_units": l,
                        "limit_vs_1f1b": l / one_f_one_b,
                        "limit_bytes": unit_bytes.map(|b| b * l),
                        "makespan": s.makespan,
                        "bubble": s.bubble,
                        "bubble_span": s.bubble_span,
                        "peak_units": s.max_peak_memory(),
                    })
                })
                .collect();
            let mut text = serde_json::to_string_pretty(&serde_json::json!({
                "schedule": kind.name(), "workers": d, "microbatches": n, "points": rows
            }))?;
            text.push('\n');
            text
        }
        _ => {
            let mut text = format!(
                "{kind}: bubble against memory limit, d={d}, n={n} (memory in units of one \
                 microbatch's activation over 1/d of the model; 1F1B's peak = {})\n\
                 smallest limit that fits: {}\n\n",
                trim_number(one_f_one_b),
                trim_number(smallest)
            );
            text.push_str(&format!(
                "{:>9} {:>8}{} {:>11} {:>9} {:>8} {:>7}\n",
                "limit",
                "x 1F1B",
                if unit_bytes.is_some() {
                    "        bytes"
                } else {
                    ""
                },
                "makespan",
                "bubble%",
                "span%",
                "peak"
            ));
            for (l, s) in &points {
                text.push_str(&format!(
                    "{:>9} {:>8.3}{} {:>11} {:>9.2} {:>8.2} {:>7}\n",
                    trim_number(*l),
                    l / one_f_one_b,
                    unit_bytes.map_or(String::new(), |b| format!(" {:>12.4e}", b * l)),
                    trim_number(s.makespan),
                    100.0 * s.bubble,
                    100.0 * s.bubble_span,
                    trim_number(s.max_peak_memory())
                ));
            }
            text
        }
    })
}

/// 1F1B's peak activation memory in units under the plan's stage memory (without
/// recomputation, the reference a `0.5x` limit is taken of): 1F1B with the
/// same layers on each worker as `placement` holds `d − w` microbatches of worker `w`'s
/// stages, so its peak is `max_w (d − w)·m_w` with `m_w` the memory of `w`'s stages: `d`
/// units when every worker holds 1/d of the model (`--times`, or `--stage-times` without
/// a memory column).
fn one_f_one_b_peak(plan: &Plan, placement: &Placement) -> Result<f64> {
    let costs = base_costs(plan, placement)?;
    let d = placement.workers() as usize;
    let mut per_worker = vec![0.0f64; d];
    for (s, c) in costs.stages.iter().enumerate() {
        per_worker[placement.worker_of(s as u32) as usize] += c.mem;
    }
    let peak = per_worker
        .iter()
        .enumerate()
        .map(|(w, m)| (d - w) as f64 * m)
        .fold(0.0, f64::max);
    if !peak.is_finite() {
        bail!("1F1B's peak memory overflows; give the stages' memory in a larger unit");
    }
    Ok(peak)
}

/// A schedule's name with the plan's recomputation: the name it was asked by (`1f1b-r`),
/// or `NAME + MODE recompute`.
fn recomputing_name(plan: &Plan, name: &str) -> String {
    match (&plan.recomputing_name, plan.recompute) {
        (Some(asked), _) => asked.clone(),
        (None, Recompute::None) => name.to_string(),
        (None, mode) => format!("{name} + {mode} recompute"),
    }
}

/// The cost model for `placement`: `--stage-times` if given, else `--times`, with the
/// plan's recomputation on every stage.
fn costs(plan: &Plan, placement: &Placement) -> Result<Costs> {
    let base = base_costs(plan, placement)?;
    if plan.recompute == Recompute::None {
        return Ok(base);
    }
    let stages = base.stages.len();
    base.recomputing(
        &vec![plan.recompute; stages],
        &vec![RecomputeShares::WITHOUT_MODEL; stages],
    )
    .context("--recompute")
}

/// The cost model without recomputation.
fn base_costs(plan: &Plan, placement: &Placement) -> Result<Costs> {
    match &plan.stage_times {
        None => Costs::uniform(placement, plan.times).context("--times"),
        Some((path, stages)) => {
            if stages.len() != placement.stages() as usize {
                bail!(
                    "--stage-times {}: {} stages given, but this schedule has {} stages \
                     ({placement} placement on {} workers); give one line per stage",
                    path.display(),
                    stages.len(),
                    placement.stages(),
                    placement.workers()
                );
            }
            let default_mem = 1.0 / f64::from(placement.chunks().max(1));
            let stages = stages
                .iter()
                .map(|s| StageCost {
                    f: s.f,
                    b: s.b,
                    w: s.w,
                    mem: s.mem.unwrap_or(default_mem),
                })
                .collect();
            Costs::per_stage(placement, stages, plan.times.comm)
                .with_context(|| format!("--stage-times {}", path.display()))
        }
    }
}

fn simulate_with(plan: &Plan, schedule: &Schedule) -> Result<Simulation> {
    let costs = costs(plan, &schedule.placement)?;
    simulate(schedule, &costs).with_context(|| format!("cannot simulate {}", schedule.name))
}

/// Simulates one planned schedule and renders it in the chosen format; its planning time
/// runs from `start` to the end of the simulation.
fn render(plan: &Plan, schedule: &Schedule, start: Instant) -> Result<String> {
    let sim = &simulate_with(plan, schedule)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(match plan.format {
        Format::Table => Report::new(schedule, sim, plan.activation_bytes, ms).table(),
        Format::Json => {
            let mut text = Report::new(schedule, sim, plan.activation_bytes, ms).to_json();
            text.push('\n');
            text
        }
        Format::Grid => {
            let q = trim_number(grid::quantum(sim));
            format!(
                "{}: d={}, n={}, makespan {}; one cell = {} time unit{}, '.' idle, '-' the \
                 pass on its left continues\n{}",
                schedule.name,
                schedule.num_workers(),
                schedule.microbatches,
                trim_number(sim.makespan),
                q,
                if q == "1" { "" } else { "s" },
                grid::grid(schedule, sim)
            )
        }
        Format::Csv => to_csv(schedule).context("--format csv")?,
        Format::Svg => svg::svg(schedule, sim),
        Format::Chrome => chrome::chrome_trace(schedule, sim),
    })
}

fn trim_number(x: f64) -> String {
    if x != 0.0 && (x.abs() >= 1e12 || x.abs() < 1e-4) {
        // Neither hundreds of digits nor a small time printed as 0.
        return format!("{x:e}");
    }
    let text = format!("{x:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Plans every known schedule on one shape.
fn compare(plan: &Plan, d: u32, n: u32, chunks: u32) -> Result<String> {
    let mut reports = Vec::new();
    let mut skipped: Vec<(ScheduleKind, String)> = Vec::new();
    for kind in ScheduleKind::ALL {
        let start = Instant::now();
        let outcome = request(plan, kind, d, n, chunks)
            .and_then(|req| generate_planned(plan, &req).map_err(anyhow::Error::from))
            .and_then(|mut schedule| {
                schedule.name = recomputing_name(plan, &schedule.name);
                let sim = simulate_with(plan, &schedule)?;
                Ok((schedule, sim))
            });
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match outcome {
            Ok((schedule, sim)) => {
                reports.push(Report::new(&schedule, &sim, plan.activation_bytes, ms));
            }
            Err(e) => skipped.push((kind, format!("{e:#}"))),
        }
    }
    if reports.is_empty() {
        let why: Vec<String> = skipped.iter().map(|(k, e)| format!("  {k}: {e}")).collect();
        bail!(
            "no schedule supports --workers {d} --microbatches {n}:\n{}",
            why.join("\n")
        );
    }
    Ok(match plan.format {
        Format::Json => {
            let skipped: Vec<serde_json::Value> = skipped
                .iter()
                .map(|(k, e)| serde_json::json!({ "schedule": k.name(), "reason": e }))
                .collect();
            let value = serde_json::json!({ "reports": reports, "skipped": skipped });
            let mut text = serde_json::to_string_pretty(&value)?;
            text.push('\n');
            text
        }
        _ => {
            let mut text = format!(
                "d={d} workers, n={n} microbatches, --times {},{},{},{}{}\n",
                trim_number(plan.times.f),
                trim_number(plan.times.b),
                trim_number(plan.times.w),
                trim_number(plan.times.comm),
                match &plan.stage_times {
                    Some((path, _)) => format!(" (compute from {})", path.display()),
                    None => String::new(),
                }
            );
            text.push_str(&compare_table(&reports));
            text.push_str(
                "peak mem: largest per-worker peak, in units of one microbatch's activation \
                 over 1/d of the model\n",
            );
            if !skipped.is_empty() {
                text.push_str("\nskipped:\n");
                for (kind, why) in &skipped {
                    text.push_str(&format!("  {kind}: {why}\n"));
                }
            }
            text
        }
    })
}

/// Writes `text` to `--output` or standard output. A closed standard output (e.g. piping
/// into `head`) is not an error.
fn write_output(plan: &Plan, text: &str) -> Result<()> {
    match &plan.output {
        Some(path) => std::fs::write(path, text)
            .with_context(|| format!("--output: cannot write {}", path.display())),
        None => {
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(e).context("cannot write to standard output")
                }
                _ => Ok(()),
            }
        }
    }
}
