//! Import and export of schedules in the CSV form of torchtitan and PyTorch's
//! `torch.distributed.pipelining` (`_dump_csv` / `_load_csv`, "compute only" format).
//!
//! # Format
//!
//! One row per worker (row 1 is worker 0), one cell per time step, no header. A cell is
//! empty (the worker is idle) or holds one action `<stage><kind><microbatch>`, e.g. `0F0`,
//! `2I0`, `2W0`, `1B3`. Stages are global (model-order) stage indices.
//!
//! The kind letters follow PyTorch, which differs from pipewise's own pass text:
//!
//! | CSV | meaning | pipewise [`PassKind`] |
//! |---|---|---|
//! | `F` | forward | `F` |
//! | `I` | backward for the input gradient | `B` |
//! | `W` | backward for the weight gradient | `W` |
//! | `B` | full backward (input and weight) | `BW` |
//!
//! The importer also accepts pipewise's own `BW` for a full backward, and PyTorch's
//! overlapped cells `(a;b;…)OVERLAP_F_B` (DualPipeV's forward of one microbatch beside the
//! backward of another), read as their actions in the order written. Rows end with `\n`,
//! `\r\n` or a lone `\r` (as Python's `csv` module reads them). PyTorch's default dump
//! ("compute_comms") also holds communication actions (`SEND_F`, `RECV_F`, `SEND_B`,
//! `RECV_B`, `UNSHARD`, `RESHARD`, `REDUCE_GRAD`): they are read past, as empty cells, since
//! pipewise places the hops between workers itself (torchtitan refuses such files).
//!
//! # Export layout
//!
//! [`to_csv`] places every pass on a unit-time grid: the schedule is simulated with every
//! chunk pass F, I and W lasting one step and a full backward `B` lasting two (it is an I
//! and a W), no communication latency. A pass is written in the cell of its first step; the
//! second step of a full backward and every idle step are empty cells. All rows are padded
//! with empty cells to the same length. The importer ignores empty cells, so only the order
//! of actions in a row matters on import: a CSV whose cells are packed without gaps reads the
//! same.
//!
//! # Import
//!
//! [`from_csv`] infers the placement from the row each stage appears in, the microbatch count
//! from the largest microbatch, then validates the schedule. Every error names the offending
//! cell by 1-based row and column ([`Error::Csv`]) where there is one.

use std::fmt::Write as _;

use crate::cost::{Costs, Times};
use crate::error::{Cell, Error, Result, Rule};
use crate::generate::{MAX_CHUNKS, MAX_MICROBATCHES, MAX_STAGE_MICROBATCHES, MAX_WORKERS};
use crate::pass::{Pass, PassKind};
use crate::placement::Placement;
use crate::schedule::Schedule;
use crate::simulate::simulate;
use crate::validate::validate;

/// The CSV (PyTorch) text of a pass: `I` for the input-gradient backward, `B` for the full
/// backward.
pub fn csv_token(pass: Pass) -> String {
    let kind = match pass.kind {
        PassKind::F => "F",
        PassKind::B => "I",
        PassKind::W => "W",
        PassKind::BW => "B",
    };
    format!("{}{kind}{}", pass.stage, pass.mb)
}

/// Writes `schedule` as CSV on a unit-time grid (see the [module docs](self) for the layout).
///
/// Fails if the schedule does not validate.
pub fn to_csv(schedule: &Schedule) -> Result<String> {
    let v = f64::from(schedule.placement.chunks());
    let costs = Costs::uniform(
        &schedule.placement,
        Times {
            f: v,
            b: v,
            w: v,
            comm: 0.0,
        },
    )?;
    let sim = simulate(schedule, &costs)?;
    let steps = sim.makespan.round().max(0.0) as usize;
    let mut out = String::new();
    for line in &sim.timeline {
        let mut cells = vec![String::new(); steps];
        for timed in line {
            let step = timed.start.round().max(0.0) as usize;
            if let Some(cell) = cells.get_mut(step) {
                *cell = csv_token(timed.pass);
            }
        }
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    Ok(out)
}

/// Where a pass was read from.
#[derive(Debug, Clone)]
struct Origin {
    /// 1-based row.
    row: usize,
    /// 1-based column.
    column: usize,
    /// The cell text, trimmed.
    text: String,
}

/// How many blocked rows besides the first a deadlock error names.
const SHOWN_STUCK: usize = 7;

/// Reads a schedule from CSV text (see the [module docs](self) for the format); `name`
/// becomes [`Schedule::name`].
///
/// Errors name the offending cell: unknown or malformed actions, a stage appearing in two
/// rows, and every validation error (missing, duplicate or misordered passes, deadlocks).
pub fn from_csv(text: &str, name: &str) -> Result<Schedule> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Rows up to the last non-blank one, counted before anything is sized by them.
    let count = lines(text)
        .enumerate()
        .filter(|(_, r)| !r.trim().is_empty())
        .last()
        .map_or(0, |(i, _)| i + 1);
    if count == 0 {
        return Err(Error::InvalidArgument {
            field: "CSV schedule",
            reason: "it has no rows (expected one row per worker)".into(),
        });
    }
    if count > MAX_WORKERS as usize {
        return Err(Error::InvalidArgument {
            field: "CSV schedule",
            reason: format!(
                "it has {count} rows (one per worker); at most {MAX_WORKERS} workers are \
                 accepted"
            ),
        });
    }
    let rows: Vec<&str> = lines(text).take(count).collect();

    // Parse every cell; remember where each pass came from.
    let mut programs: Vec<Vec<Pass>> = Vec::with_capacity(rows.len());
    let mut origins: Vec<Vec<Origin>> = Vec::with_capacity(rows.len());
    for (r, line) in rows.iter().enumerate() {
        let mut program = Vec::new();
        let mut origin = Vec::new();
        for (c, raw) in line.split(',').enumerate() {
            let quoted = raw.trim();
            if quoted.starts_with('"') != quoted.ends_with('"') || quoted == "\"" {
                return Err(Error::Csv {
                    row: r + 1,
                    column: c + 1,
                    cell: quoted.to_string(),
                    reason: "an unmatched quote: a cell holds one action, and a quoted cell \
                             cannot hold a comma"
                        .into(),
                });
            }
            let cell = quoted.trim_matches('"').trim();
            if cell.is_empty() {
                continue;
            }
            let passes = parse_cell(cell)
                .and_then(|ps| {
                    ps.into_iter()
                        .map(|p| within_limits(p, rows.len()))
                        .collect::<std::result::Result<Vec<_>, _>>()
                })
                .map_err(|reason| Error::Csv {
                    row: r + 1,
                    column: c + 1,
                    cell: cell.to_string(),
                    reason,
                })?;
            for pass in passes {
                program.push(pass);
                origin.push(Origin {
                    row: r + 1,
                    column: c + 1,
                    text: cell.to_string(),
                });
            }
        }
        if program.is_empty() {
            return Err(Error::InvalidArgument {
                field: "CSV schedule",
                reason: format!(
                    "row {} has no actions; every row is a worker, and every worker must run \
                     a stage (remove the row)",
                    r + 1
                ),
            });
        }
        programs.push(program);
        origins.push(origin);
    }

    // Placement: the row of every stage.
    let workers = programs.len() as u32;
    let mut home: Vec<Option<(u32, usize)>> = Vec::new();
    for (w, program) in programs.iter().enumerate() {
        for (p, pass) in program.iter().enumerate() {
            let s = pass.stage as usize;
            if s >= home.len() {
                home.resize(s + 1, None);
            }
            match home[s] {
                None => home[s] = Some((w as u32, p)),
                Some((other, first)) if other != w as u32 => {
                    let o = &origins[other as usize][first];
                    let here = &origins[w][p];
                    return Err(Error::Csv {
                        row: here.row,
                        column: here.column,
                        cell: here.text.clone(),
                        reason: format!(
                            "stage {s} also appears in row {} column {} ({:?}); every stage \
                             must run on one worker (one row)",
                            o.row, o.column, o.text
                        ),
                    });
                }
                Some(_) => {}
            }
        }
    }
    let mut worker_of = Vec::with_capacity(home.len());
    for (s, h) in home.iter().enumerate() {
        match h {
            Some((w, _)) => worker_of.push(*w),
            None => {
                return Err(Error::InvalidArgument {
                    field: "CSV schedule",
                    reason: format!(
                        "stage {s} never appears, but stages up to {} do; stages must be \
                         numbered 0, 1, 2, … without gaps",
                        home.len() - 1
                    ),
                });
            }
        }
    }
    let microbatches = programs
        .iter()
        .flatten()
        .map(|p| p.mb + 1)
        .max()
        .unwrap_or(0);
    if microbatches == 0 {
        return Err(Error::InvalidArgument {
            field: "CSV schedule",
            reason: "it has no actions (every cell is empty)".into(),
        });
    }
    let size = worker_of.len() as u64 * u64::from(microbatches);
    if size > MAX_STAGE_MICROBATCHES {
        return Err(Error::InvalidArgument {
            field: "CSV schedule",
            reason: format!(
                "{} stages × {microbatches} microbatches is {size}; at most \
                 {MAX_STAGE_MICROBATCHES} are planned",
                worker_of.len()
            ),
        });
    }

    let schedule = Schedule {
        name: name.to_string(),
        placement: Placement::from_table(worker_of, workers),
        microbatches,
        workers: programs,
    };
    match validate(&schedule) {
        Ok(_) => Ok(schedule),
        Err(err) => Err(locate(&schedule, &origins, err)),
    }
}

/// Refuses a pass whose numbers are beyond what `pipewise plan` plans (before they size
/// any table): microbatches below [`MAX_MICROBATCHES`], stages below
/// [`MAX_CHUNKS`] per row (the rows are at most [`MAX_WORKERS`]).
fn within_limits(pass: Pass, rows: usize) -> std::result::Result<Pass, String> {
    if pass.mb >= MAX_MICROBATCHES {
        return Err(format!(
            "microbatch {} is too large: at most {MAX_MICROBATCHES} microbatches are accepted",
            pass.mb
        ));
    }
    let stages = u64::from(MAX_CHUNKS) * rows as u64;
    if u64::from(pass.stage) >= stages {
        return Err(format!(
            "stage {} is too large: {rows} rows hold at most {stages} stages ({MAX_CHUNKS} \
             per worker)",
            pass.stage
        ));
    }
    Ok(pass)
}

/// The rows of `text`: lines ended by `\n`, `\r\n` or a lone `\r`.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    text.split('\n')
        .flat_map(|line| line.strip_suffix('\r').unwrap_or(line).split('\r'))
}

/// Parses one non-empty cell into its passes (one; none for a communication action; or
/// those of an overlapped cell `(a;b)OVERLAP_F_B`, in the order written), or says why it
/// cannot.
fn parse_cell(cell: &str) -> std::result::Result<Vec<Pass>, String> {
    let Some(inner) = cell.strip_prefix('(') else {
        return parse_action(cell).map(|p| p.into_iter().collect());
    };
    let Some((actions, kind)) = inner.split_once(')') else {
        return Err(
            "an overlapped cell without its closing parenthesis; expected \
                    (<action>;<action>)OVERLAP_F_B, e.g. (0F7;7B3)OVERLAP_F_B"
                .into(),
        );
    };
    if actions.contains('(') {
        return Err("overlapped cells do not nest".into());
    }
    if kind.trim() != "OVERLAP_F_B" {
        return Err(format!(
            "unknown overlapped action {kind:?}; expected (<action>;<action>)OVERLAP_F_B, \
             e.g. (0F7;7B3)OVERLAP_F_B"
        ));
    }
    let mut passes = Vec::new();
    for a in actions.split(';').map(str::trim) {
        passes.extend(parse_action(a).map_err(|e| format!("in {a:?}: {e}"))?);
    }
    Ok(passes)
}

/// Parses one action `<stage><kind><microbatch>` (`None`: a communication action), or
/// says why it cannot.
fn parse_action(cell: &str) -> std::result::Result<Option<Pass>, String> {
    let digits_end = cell
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(cell.len());
    let (stage_text, rest) = cell.split_at(digits_end);
    let kind_end = rest
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (kind_text, mb_text) = rest.split_at(kind_end);
    const SHAPE: &str = "expected <stage><F|I|W|B><microbatch>, e.g. 0F0, 2I0, 2W0, 1B3 \
                         (I: input-gradient backward, B: full backward; BW is accepted too)";
    let comm = [
        "SEND_F",
        "RECV_F",
        "SEND_B",
        "RECV_B",
        "UNSHARD",
        "RESHARD",
        "REDUCE_GRAD",
    ];
    if comm.contains(&kind_text) {
        // PyTorch's default dump ("compute_comms") interleaves these with the compute
        // actions; pipewise models the hops itself, so only their shape is checked.
        if stage_text.is_empty() || !mb_text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "expected <stage>{kind_text}[<microbatch>], e.g. 0{kind_text}{}",
                if kind_text.starts_with("SEND") || kind_text.starts_with("RECV") {
                    "0"
                } else {
                    ""
                }
            ));
        }
        return Ok(None);
    }
    let kind = match kind_text {
        "F" => PassKind::F,
        "I" => PassKind::B,
        "W" => PassKind::W,
        "B" | "BW" => PassKind::BW,
        "" => return Err(format!("no action letter; {SHAPE}")),
        other => return Err(format!("unknown action {other:?}; {SHAPE}")),
    };
    if stage_text.is_empty() {
        return Err(format!("no stage number before {kind_text:?}; {SHAPE}"));
    }
    if mb_text.is_empty() {
        return Err(format!("no microbatch number after {kind_text:?}; {SHAPE}"));
    }
    if !mb_text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "trailing text after the microbatch number; {SHAPE}"
        ));
    }
    let number = |text: &str, what: &str| {
        text.parse::<u32>()
            .map_err(|_| format!("{what} {text} is too large"))
    };
    Ok(Some(Pass::new(
        kind,
        number(stage_text, "stage")?,
        number(mb_text, "microbatch")?,
    )))
}

/// The dependency rules in CSV (PyTorch) terms.
fn rule_text(rule: Rule) -> &'static str {
    match rule {
        Rule::ForwardChain => "F of stage s before F of stage s+1",
        Rule::BackwardChain => "backward (I or B) of stage s+1 before backward of stage s",
        Rule::ForwardBeforeBackward => "F before I or B of the same stage and microbatch",
        Rule::InputBeforeWeight => "I before W of the same stage and microbatch",
    }
}

/// Rewrites a validation error of an imported schedule so that it names CSV cells.
fn locate(schedule: &Schedule, origins: &[Vec<Origin>], err: Error) -> Error {
    let origin_of = |cell: &Cell| -> Option<&Origin> {
        origins
            .get(cell.worker as usize)
            .and_then(|row| row.get(cell.pos as usize))
    };
    // Where a pass sits, by content (for passes an error names without a position).
    let find = |pass: Pass| -> Option<&Origin> {
        let w = schedule.placement.worker_of(pass.stage) as usize;
        let pos = schedule.workers.get(w)?.iter().position(|p| *p == pass)?;
        origins.get(w)?.get(pos)
    };
    let describe = |pass: Pass| -> String {
        match find(pass) {
            Some(o) => format!("{:?} (row {} column {})", o.text, o.row, o.column),
            None => format!("{:?}", csv_token(pass)),
        }
    };
    let at = |cell: &Cell, reason: String| -> Error {
        match origin_of(cell) {
            Some(o) => Error::Csv {
                row: o.row,
                column: o.column,
                cell: o.text.clone(),
                reason,
            },
            None => Error::InvalidArgument {
                field: "CSV schedule",
                reason,
            },
        }
    };
    let placed = |pass: Pass| -> Option<Error> {
        let o = find(pass)?;
        Some(Error::Csv {
            row: o.row,
            column: o.column,
            cell: o.text.clone(),
            reason: String::new(),
        })
    };
    let with_reason = |e: Option<Error>, reason: String| -> Error {
        match e {
            Some(Error::Csv {
                row, column, cell, ..
            }) => Error::Csv {
                row,
                column,
                cell,
                reason,
            },
            _ => Error::InvalidArgument {
                field: "CSV schedule",
                reason,
            },
        }
    };
    match err {
        Error::OutOfOrder { at: a, needs, rule } => at(
            &a,
            format!(
                "breaks rule \"{}\": it needs {}, which comes later in the same row",
                rule_text(rule),
                describe(needs.pass)
            ),
        ),
        Error::DuplicatePass { at: a, first } => {
            let first_text = origin_of(&first)
                .map(|o| format!("row {} column {}", o.row, o.column))
                .unwrap_or_else(|| "an earlier cell".into());
            at(&a, format!("duplicate of the action in {first_text}"))
        }
        Error::MixedBackward { at: a } => at(
            &a,
            format!(
                "stage {} microbatch {} has both a full backward B and split I/W actions; \
                 use either B, or I and W (files from older PyTorch releases write B for \
                 the input gradient and BW for the full backward: there, write I for B)",
                a.pass.stage, a.pass.mb
            ),
        ),
        Error::MissingPass { pass } => {
            let (s, mb) = (pass.stage, pass.mb);
            let row = schedule.placement.worker_of(s) + 1;
            match pass.kind {
                PassKind::W => with_reason(
                    placed(Pass::b(s, mb)),
                    format!(
                        "this input-gradient backward has no matching weight-gradient \
                         backward {:?} (row {row})",
                        csv_token(pass)
                    ),
                ),
                PassKind::B => with_reason(
                    placed(Pass::w(s, mb)),
                    format!(
                        "this weight-gradient backward has no matching input-gradient \
                         backward {:?} (row {row})",
                        csv_token(pass)
                    ),
                ),
                PassKind::BW => with_reason(
                    placed(Pass::f(s, mb)),
                    format!(
                        "this forward has no backward: row {row} needs {:?} (full backward), \
                         or {:?} and {:?}",
                        csv_token(pass),
                        csv_token(Pass::b(s, mb)),
                        csv_token(Pass::w(s, mb))
                    ),
                ),
                PassKind::F => {
                    let backward = [Pass::bw(s, mb), Pass::b(s, mb), Pass::w(s, mb)]
                        .into_iter()
                        .find_map(placed);
                    let reason = if backward.is_some() {
                        format!(
                            "this backward has no forward {:?} (row {row})",
                            csv_token(pass)
                        )
                    } else {
                        format!(
                            "stage {s} has no actions for microbatch {mb}: row {row} needs \
                             {:?} and its backward (microbatches are 0 to {}, from the largest \
                             microbatch in the file)",
                            csv_token(pass),
                            schedule.microbatches - 1
                        )
                    };
                    with_reason(backward, reason)
                }
            }
        }
        Error::Deadlock { stuck } => {
            let Some((first, waits)) = stuck.first() else {
                return Error::InvalidArgument {
                    field: "CSV schedule",
                    reason: "deadlock".into(),
                };
            };
            let mut reason = format!(
                "deadlock: this action waits for {}, which can never run",
                describe(*waits)
            );
            // A few of the other blocked rows; a ring of thousands would be a huge line.
            for (cell, waits) in stuck[1..].iter().take(SHOWN_STUCK) {
                if let Some(o) = origin_of(cell) {
                    let _ = write!(
                        reason,
                        "; row {} column {} ({:?}) waits for {}",
                        o.row,
                        o.column,
                        o.text,
                        describe(*waits)
                    );
                }
            }
            if stuck.len() > SHOWN_STUCK + 1 {
                let _ = write!(
                    reason,
                    "; and {} more blocked rows",
                    stuck.len() - SHOWN_STUCK - 1
                );
            }
            at(first, reason)
        }
        Error::UnknownStage { at: a, .. }
        | Error::MicrobatchOutOfRange { at: a, .. }
        | Error::WrongWorker { at: a, .. } => {
            let reason = err.to_string();
            at(&a, reason)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Request, ScheduleKind, generate};

    fn csv_error(text: &str) -> (usize, usize, String, String) {
        match from_csv(text, "test") {
            Err(Error::Csv {
                row,
                column,
                cell,
                reason,
            }) => (row, column, cell, reason),
            other => panic!("expected a CSV error, got {other:?}"),
        }
    }

    #[test]
    fn round_trips_generated_schedules() {
        let cases = [
            (ScheduleKind::OneFOneB, 4, 8, 2),
            (ScheduleKind::GPipe, 3, 5, 2),
            (ScheduleKind::ZbH1, 4, 8, 2),
            (ScheduleKind::VHalf, 4, 8, 2),
            (ScheduleKind::VMin, 4, 8, 2),
            (ScheduleKind::Interleaved1F1B, 4, 8, 2),
            (ScheduleKind::Interleaved1F1B, 2, 6, 3),
            (ScheduleKind::DualPipeV, 3, 6, 2),
        ];
        for (kind, d, n, v) in cases {
            let req = Request {
                chunks: v,
                ..Request::new(kind, d, n)
            };
            let schedule = generate(&req).expect("generates");
            let text = to_csv(&schedule).expect("exports");
            assert_eq!(text.lines().count(), d as usize, "{kind}");
            let back = from_csv(&text, &schedule.name).expect("imports");
            assert_eq!(back, schedule, "{kind}:\n{text}");
        }
    }

    #[test]
    fn exports_pytorch_letters_on_unit_steps() {
        let schedule = generate(&Request::new(ScheduleKind::OneFOneB, 2, 2)).expect("1f1b");
        let text = to_csv(&schedule).expect("exports");
        // BW (PyTorch B) takes two steps: the token, then an empty cell.
        assert_eq!(
            text, "0F0,0F1,,,0B0,,,0B1,\n,1F0,1B0,,1F1,1B1,,,\n",
            "{text}"
        );
        let split = generate(&Request::new(ScheduleKind::ZbH1, 2, 2)).expect("zb-h1");
        let text = to_csv(&split).expect("exports");
        assert!(text.contains("1I0") && text.contains("1W0"), "{text}");
    }

    #[test]
    fn accepts_whitespace_blanks_and_bw() {
        let text = " 0F0 , 0F1,\"0BW0\",, 0B1 \r\n\n\n";
        let s = from_csv(text, "x").expect("imports");
        assert_eq!(s.microbatches, 2);
        assert_eq!(
            s.workers,
            vec![vec![
                Pass::f(0, 0),
                Pass::f(0, 1),
                Pass::bw(0, 0),
                Pass::bw(0, 1)
            ]]
        );
        assert_eq!(s.placement, Placement::OnePerWorker { workers: 1 });
    }

    #[test]
    fn names_the_cell_of_an_out_of_order_pass() {
        let (row, column, cell, reason) = csv_error("0F0,0W0,0I0\n");
        assert_eq!((row, column, cell.as_str()), (1, 2, "0W0"), "{reason}");
        assert!(reason.contains("breaks rule"), "{reason}");
        assert!(reason.contains("I before W"), "{reason}");

        let (row, column, cell, reason) = csv_error("0F0,0I0,0W0\n1I0,1F0,1W0\n");
        assert_eq!((row, column, cell.as_str()), (2, 1, "1I0"), "{reason}");
        assert!(reason.contains("\"1F0\" (row 2 column 2)"), "{reason}");
        let message = Error::Csv {
            row,
            column,
            cell,
            reason,
        }
        .to_string();
        assert!(
            message.starts_with("CSV row 2 column 1 (\"1I0\"): breaks rule"),
            "{message}"
        );
    }

    #[test]
    fn names_the_cell_of_a_deadlock() {
        // V placement on 2 workers: worker 0 holds stages 0 and 3. 3F0 needs 2F0 on worker 1,
        // which needs 1F0, which needs 0F0 — after 3F0 on worker 0.
        let text = "3F0,0F0,3B0,0B0\n1F0,2F0,2B0,1B0\n";
        let (row, column, cell, reason) = csv_error(text);
        assert_eq!((row, column, cell.as_str()), (1, 1, "3F0"), "{reason}");
        assert!(reason.contains("deadlock"), "{reason}");
        assert!(reason.contains("row 2 column 1 (\"1F0\")"), "{reason}");
    }

    /// The reason of an error that names no cell.
    fn file_error(text: &str) -> String {
        match from_csv(text, "test") {
            Err(Error::InvalidArgument { field, reason }) => {
                assert_eq!(field, "CSV schedule");
                reason
            }
            other => panic!("expected a whole-file error, got {other:?}"),
        }
    }

    #[test]
    fn refuses_split_quotes_empty_rows_and_too_many_rows() {
        // A quoted cell with a comma is one cell in CSV; it used to be read as two actions.
        let (row, column, cell, reason) = csv_error("\"0F0,0B0\"");
        assert_eq!((row, column, cell.as_str()), (1, 1, "\"0F0"), "{reason}");
        assert!(reason.contains("unmatched quote"), "{reason}");
        let quoted = from_csv("\"0F0\",\"0B0\"", "ok").map(|s| s.microbatches);
        assert_eq!(quoted.ok(), Some(1));
        // A row without actions is not an idle worker (a spreadsheet's trailing ",,,").
        for text in ["0F0,0B0\n,,,\n", "0F0,0B0\n\n1F0,1B0\n"] {
            let reason = file_error(text);
            assert!(reason.contains("row 2 has no actions"), "{reason}");
        }
        // Rows are counted before anything is sized by them (50 MB of newlines took 3 GB).
        let many = format!("{}0F0", "\n".repeat(5000));
        let reason = file_error(&many);
        assert!(reason.contains("it has 5001 rows"), "{reason}");
        let reason = file_error("\n0F0,0B0\n");
        assert!(reason.contains("row 1 has no actions"), "{reason}");
    }

    #[test]
    fn a_deadlocked_ring_names_a_few_rows() {
        // Row 0 runs 0F0 then waits for the backward of microbatch 0; every other row starts
        // with microbatch 1, whose forward waits behind that backward on row 0.
        let mut text = String::from("0F0,0B0,0F1,0B1\n");
        for s in 1..20 {
            text += &format!("{s}F1,{s}F0,{s}B0,{s}B1\n");
        }
        let (_, _, _, reason) = csv_error(&text);
        assert!(reason.contains("deadlock"), "{reason}");
        assert_eq!(
            reason.matches("waits for").count(),
            1 + SHOWN_STUCK,
            "{reason}"
        );
        assert!(reason.ends_with("and 12 more blocked rows"), "{reason}");
    }

    #[test]
    fn refuses_numbers_beyond_the_limits_before_allocating() {
        // These used to size tables from the cell's numbers (tens of gigabytes) or wrap.
        let (row, column, cell, reason) = csv_error("0F0,0B0\n4000000000F0,4000000000B0");
        assert_eq!(
            (row, column, cell.as_str()),
            (2, 1, "4000000000F0"),
            "{reason}"
        );
        assert!(reason.contains("stage 4000000000 is too large"), "{reason}");
        let (_, _, _, reason) = csv_error("0F3999999999");
        assert!(
            reason.contains("microbatch 3999999999 is too large"),
            "{reason}"
        );
        let (_, _, _, reason) = csv_error("0F4294967295,0B4294967295");
        assert!(reason.contains("is too large"), "{reason}");
        let err = from_csv("0F0,0B0", "ok").map(|s| s.microbatches);
        assert_eq!(err.ok(), Some(1));
    }

    #[test]
    fn rejects_unknown_tokens_with_position() {
        let (row, column, cell, reason) = csv_error("0F0,0B0\n,1F0,1X0\n");
        assert_eq!((row, column, cell.as_str()), (2, 3, "1X0"));
        assert!(reason.contains("unknown action \"X\""), "{reason}");
        for (bad, says) in [
            ("F0", "no stage"),
            ("0F", "no microbatch"),
            ("0F0x", "trailing"),
            (
                "SEND_F0",
                "expected <stage>SEND_F[<microbatch>], e.g. 0SEND_F0",
            ),
            (
                "1UNSHARD0x",
                "expected <stage>UNSHARD[<microbatch>], e.g. 0UNSHARD",
            ),
            ("0F99999999999", "too large"),
            ("(0F0;1I0", "closing parenthesis"),
            ("(0F0;1I0)OVERLAP", "unknown overlapped action"),
            ("(0F0;(1I0;1W0)OVERLAP_F_B)OVERLAP_F_B", "do not nest"),
            ("(0F0;1X0)OVERLAP_F_B", "in \"1X0\": unknown action"),
        ] {
            let (row, column, cell, reason) = csv_error(&format!("0F0,{bad}\n"));
            assert_eq!((row, column, cell.as_str()), (1, 2, bad));
            assert!(reason.contains(says), "{bad}: {reason}");
        }
    }

    /// PyTorch's DualPipeV dumps hold overlapped cells `(a;b)OVERLAP_F_B`: read as their
    /// actions in order, they give the schedule of the same actions one per cell.
    #[test]
    fn reads_overlapped_cells_as_their_actions_in_order() {
        let schedule = generate(&Request::new(ScheduleKind::DualPipeV, 4, 10)).expect("generates");
        let text = to_csv(&schedule).expect("exports");
        let mut overlapped = 0;
        let merged: Vec<String> = text
            .lines()
            .map(|line| {
                let cells: Vec<&str> = line.split(',').filter(|c| !c.is_empty()).collect();
                let mut out = Vec::new();
                let mut i = 0;
                while i < cells.len() {
                    let pair = cells.get(i + 1).filter(|next| {
                        cells[i].contains('F') && (next.contains('B') || next.contains('I'))
                    });
                    if let Some(next) = pair {
                        out.push(format!("({};{next})OVERLAP_F_B", cells[i]));
                        overlapped += 1;
                        i += 2;
                    } else {
                        out.push(cells[i].to_string());
                        i += 1;
                    }
                }
                out.join(",")
            })
            .collect();
        assert!(overlapped > 10, "{overlapped}");
        let back = from_csv(&merged.join("\r\n"), &schedule.name).expect("imports");
        assert_eq!(back, schedule, "{}", merged.join("\n"));
    }

    /// PyTorch's default dump interleaves communication actions with the compute ones:
    /// they are read past.
    #[test]
    fn reads_past_communication_actions() {
        let schedule =
            generate(&Request::new(ScheduleKind::Interleaved1F1B, 2, 4)).expect("generates");
        let text = to_csv(&schedule).expect("exports");
        let with_comms: Vec<String> = text
            .lines()
            .enumerate()
            .map(|(w, line)| {
                let mut cells = vec![format!("{w}UNSHARD")];
                for c in line.split(',') {
                    cells.push(c.to_string());
                    if c.contains('F') {
                        cells.push(c.replace('F', "SEND_F"));
                    } else if c.contains('I') || c.contains('B') {
                        cells.push(c.replace(['I', 'B'], "RECV_B"));
                    }
                }
                cells.push(format!("{w}REDUCE_GRAD"));
                cells.join(",")
            })
            .collect();
        let back = from_csv(&with_comms.join("\n"), &schedule.name).expect("imports");
        assert_eq!(back, schedule, "{}", with_comms.join("\n"));
        // A row of communication alone is a row without actions.
        let err = from_csv(&format!("{text}0SEND_F0\n"), "x").expect_err("no actions");
        assert!(err.to_string().contains("has no actions"), "{err}");
    }

    /// A file in older PyTorch's letters (B for the input gradient) is refused with that
    /// hint.
    #[test]
    fn older_pytorch_letters_get_a_hint() {
        let schedule = generate(&Request::new(ScheduleKind::ZbH1, 2, 4)).expect("generates");
        let old = to_csv(&schedule).expect("exports").replace('I', "B");
        let (_, _, _, reason) = csv_error(&old);
        assert!(reason.contains("older PyTorch releases"), "{reason}");
    }

    /// Rows may end with a lone carriage return (Python's `csv` reads those too).
    #[test]
    fn reads_rows_ended_by_a_lone_carriage_return() {
        let schedule = generate(&Request::new(ScheduleKind::OneFOneB, 4, 8)).expect("generates");
        let text = to_csv(&schedule).expect("exports").replace('\n', "\r");
        let back = from_csv(&text, &schedule.name).expect("imports");
        assert_eq!(back, schedule);
    }

    #[test]
    fn rejects_inconsistent_placements_and_missing_passes() {
        let (row, column, _, reason) = csv_error("0F0,0B0\n0F1,0B1\n");
        assert_eq!((row, column), (2, 1));
        assert!(reason.contains("row 1 column 1"), "{reason}");

        let err = from_csv("0F0,0B0\n2F0,2B0\n", "x").expect_err("stage 1 missing");
        assert!(err.to_string().contains("stage 1 never appears"), "{err}");

        let (row, column, cell, reason) = csv_error("0F0,0I0\n");
        assert_eq!((row, column, cell.as_str()), (1, 2, "0I0"));
        assert!(reason.contains("\"0W0\""), "{reason}");

        let (row, column, cell, reason) = csv_error("0F0,0F1,0B1\n");
        assert_eq!((row, column, cell.as_str()), (1, 1, "0F0"));
        assert!(reason.contains("no backward"), "{reason}");

        let (row, column, _, reason) = csv_error("0F0,0B0,0F0\n");
        assert_eq!((row, column), (1, 3));
        assert!(reason.contains("duplicate"), "{reason}");

        let (_, _, _, reason) = csv_error("0F0,0B0,0I0,0W0\n");
        assert!(reason.contains("both a full backward"), "{reason}");

        assert!(from_csv("\n\n", "x").is_err());
        assert!(from_csv(",,\n", "x").is_err());
    }
}
