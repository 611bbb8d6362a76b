//! Fuzz target: CSV schedule import (`from_csv`, as `pipewise plan --import` takes a
//! torchtitan / PyTorch dump). Inputs: every generated schedule on 1 to 4 workers and the
//! schedule in `docs/experiments`, exported and then edited cell by cell (moved, dropped,
//! renumbered, relettered, quoted, overlapped, communication actions added), row by row and
//! as text.

use std::sync::OnceLock;

use pipewise_common::Error;
use pipewise_common::csv::{from_csv, to_csv};
use pipewise_common::generate::{Request, ScheduleKind, generate};
use pipewise_common::validate::validate;
use pipewise_fuzz::arbitrary::{Result, Unstructured};
use pipewise_fuzz::{mutate, run};

/// Cases `cargo test` runs (a few seconds in a debug build, the same cases every run); longer
/// runs set `PIPEWISE_FUZZ_SECS` or `PIPEWISE_FUZZ_CASES` (docs/fuzzing.md).
const CASES: u64 = 10_000;

/// The seed files: exported generated schedules and the repository's CSV.
fn seeds() -> &'static [String] {
    static SEEDS: OnceLock<Vec<String>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut seeds = vec![include_str!("../../docs/experiments/v_comm_d16_n32.csv").to_string()];
        for kind in ScheduleKind::ALL {
            for workers in 1..=4 {
                for microbatches in [1, 2, 4, 8] {
                    let request = Request::new(kind, workers, microbatches);
                    if let Ok(csv) = generate(&request).and_then(|s| to_csv(&s)) {
                        seeds.push(csv);
                    }
                }
            }
        }
        seeds
    })
}

const WORDS: [&str; 16] = [
    "0F0",
    "1I0",
    "1W0",
    "0B1",
    "2BW3",
    "0SEND_F0",
    "1RECV_B2",
    "0UNSHARD",
    "1REDUCE_GRAD",
    "(0F1;1B0)OVERLAP_F_B",
    "(0F1",
    "OVERLAP_F_B",
    "\"0F0\"",
    "\"",
    "\r\n",
    "\u{feff}",
];

/// A cell's action with its numbers or letter changed.
fn renumbered(u: &mut Unstructured<'_>, cell: &str) -> Result<String> {
    // Leading digits (the stage), trailing digits (the microbatch), the letters between.
    let stage_len = cell.len() - cell.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let mb_len = cell.len() - cell.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stage, rest) = cell.split_at(stage_len);
    let (kind, mb) = rest.split_at(rest.len() - mb_len.min(rest.len()));
    let bump = |u: &mut Unstructured<'_>, n: &str| -> Result<String> {
        let n: u64 = n.parse().unwrap_or(0);
        Ok(match u.int_in_range(0..=3)? {
            0 => n.saturating_add(1).to_string(),
            1 => n.saturating_sub(1).to_string(),
            2 => mutate::number_u64(u)?.to_string(),
            _ => String::new(),
        })
    };
    Ok(match u.int_in_range(0..=2)? {
        0 => format!("{}{kind}{mb}", bump(u, stage)?),
        1 => format!("{stage}{kind}{}", bump(u, mb)?),
        _ => {
            let letter = *u.choose(&["F", "I", "W", "B", "BW", "X", "", "f", "SEND_F", "B W"])?;
            format!("{stage}{letter}{mb}")
        }
    })
}

/// One edit of the grid of cells.
fn edit(u: &mut Unstructured<'_>, rows: &mut Vec<Vec<String>>) -> Result<()> {
    if rows.is_empty() {
        rows.push(Vec::new());
    }
    let r = u.choose_index(rows.len())?;
    let other = u.choose_index(rows.len())?;
    if rows[r].is_empty() {
        rows[r].push(String::new());
    }
    let c = u.choose_index(rows[r].len())?;
    match u.int_in_range(0..=11)? {
        0 => {
            let d = u.choose_index(rows[r].len())?;
            rows[r].swap(c, d);
        }
        1 => {
            let cell = rows[r].remove(c);
            let to = u.choose_index(rows[other].len() + 1)?;
            rows[other].insert(to, cell);
        }
        2 => rows[r][c].clear(),
        3 => {
            let cell = rows[r][c].clone();
            let to = u.choose_index(rows[other].len() + 1)?;
            rows[other].insert(to, cell);
        }
        4 => rows[r][c] = renumbered(u, &rows[r][c].clone())?,
        5 => {
            // PyTorch's communication actions: a send or receive of F or B, or a sharding one.
            let comm = if u.arbitrary()? {
                let way = *u.choose(&["SEND", "RECV"])?;
                format!("{way}_{}", u.choose(&["F", "B"])?)
            } else {
                u.choose(&["UNSHARD", "RESHARD", "REDUCE_GRAD"])?
                    .to_string()
            };
            let stage = u.int_in_range(0..=9)?;
            let mb = if u.arbitrary()? {
                u.int_in_range(0..=9)?.to_string()
            } else {
                String::new()
            };
            rows[r].insert(c, format!("{stage}{comm}{mb}"));
        }
        6 if c + 1 < rows[r].len() => {
            let (a, b) = (rows[r][c].clone(), rows[r].remove(c + 1));
            let close =
                *u.choose(&[")OVERLAP_F_B", ")OVERLAP_F_B", ")", ")OVERLAP", "", ");(x)"])?;
            rows[r][c] = format!("({a};{b}{close}");
        }
        7 => {
            let quote = *u.choose(&["\"{}\"", "\"{}", "{}\"", " \" {} \" "])?;
            rows[r][c] = quote.replace("{}", &rows[r][c]);
        }
        8 => {
            rows.remove(r);
        }
        9 => {
            let row = rows[r].clone();
            rows.insert(other, row);
        }
        10 => rows.insert(other, vec![String::new(); u.int_in_range(0..=3)?]),
        _ => rows[r][c] = format!(" {} ", rows[r][c]),
    }
    Ok(())
}

/// A seed with cells, rows and text edited.
fn mutant(u: &mut Unstructured<'_>) -> Result<String> {
    let seed = u.choose(seeds())?;
    let mut rows: Vec<Vec<String>> = seed
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    for _ in 0..u.int_in_range(0..=6)? {
        edit(u, &mut rows)?;
    }
    let end = *u.choose(&["\n", "\n", "\r\n", "\r"])?;
    let mut text: String = rows
        .iter()
        .map(|r| r.join(","))
        .collect::<Vec<_>>()
        .join(end);
    if u.arbitrary()? {
        text.push_str(end);
    }
    if u.int_in_range(0..=15)? == 15 {
        text.insert(0, '\u{feff}');
    }
    if u.int_in_range(0..=3)? == 3 {
        text = mutate::text(u, &text, &WORDS, 3)?;
    }
    Ok(text)
}

/// A few words of an error's reason, without numbers or quoted text, to count outcomes by.
fn gist(reason: &str) -> String {
    reason
        .split_whitespace()
        .take_while(|w| !w.starts_with(|c: char| c.is_ascii_digit() || c == '"' || c == '('))
        .take(5)
        .collect::<Vec<_>>()
        .join(" ")
}

/// An import names the offending cell (row and column within the file) or the file, and
/// says why; an imported schedule is valid and reads back the same after export.
fn check(text: &str) -> pipewise_fuzz::Verdict {
    let lines = text.split(['\n', '\r']).count();
    match from_csv(text, "fuzz") {
        Err(Error::Csv {
            row,
            column,
            reason,
            ..
        }) => {
            if row >= 1 && row <= lines && column >= 1 && !reason.trim().is_empty() {
                Ok(format!("refused cell: {}", gist(&reason)))
            } else {
                Err(format!("row {row} column {column} of {lines} lines, reason {reason:?}").into())
            }
        }
        Err(Error::InvalidArgument {
            field: "CSV schedule",
            reason,
        }) if !reason.trim().is_empty() => Ok(format!("refused file: {}", gist(&reason))),
        Err(other) => Err(format!("refused naming no cell: {other:?}").into()),
        Ok(schedule) => {
            validate(&schedule).map_err(|e| format!("imported an invalid schedule: {e}"))?;
            let again = to_csv(&schedule).map_err(|e| format!("cannot export an import: {e}"))?;
            match from_csv(&again, "fuzz") {
                Ok(back) if back == schedule => Ok("imported".into()),
                other => {
                    Err(format!("an import does not read back after export: {other:?}").into())
                }
            }
        }
    }
}

#[test]
fn csv_schedules_are_imported_or_refused_by_cell() {
    let report = run("csv_import", CASES, |u| match mutant(u) {
        Ok(text) => check(&text),
        Err(e) => Err(format!("generator: {e}").into()),
    });
    assert!(report.cases > 0);
}
