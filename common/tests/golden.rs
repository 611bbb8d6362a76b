//! Golden files: every generator's schedule at a few shapes, in PyTorch's CSV form
//! (`testdata/schedules/KIND-dD-nN.csv`), compared byte for byte with what it generates
//! now. A change to any generator's output shows here as a diff to review; after an
//! intended change, `PIPEWISE_BLESS=1 cargo test -p pipewise-common --test golden` writes
//! the files again.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use pipewise_common::{Request, ScheduleKind, csv, generate};

/// The shapes every kind is kept at: (workers, microbatches), each at least its kind's
/// smallest microbatch count.
const SHAPES: [(u32, u32); 3] = [(2, 4), (4, 8), (4, 12)];

fn folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/schedules")
}

#[test]
fn every_generator_matches_its_golden_files() {
    let bless = std::env::var_os("PIPEWISE_BLESS").is_some();
    let dir = folder();
    if bless {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut kept = Vec::new();
    let mut differ = Vec::new();
    for kind in ScheduleKind::ALL {
        for (d, n) in SHAPES {
            let n = n.max(kind.min_microbatches(d));
            let name = format!("{}-d{d}-n{n}.csv", kind.name());
            let schedule = generate(&Request::new(kind, d, n))
                .unwrap_or_else(|e| panic!("{name}: a shape the generator takes: {e}"));
            let text = csv::to_csv(&schedule).unwrap();
            let path = dir.join(&name);
            if bless {
                std::fs::write(&path, &text).unwrap();
            } else {
                match std::fs::read_to_string(&path) {
                    Ok(golden) if golden == text => {}
                    Ok(_) => differ.push(name.clone()),
                    Err(e) => differ.push(format!("{name} ({e})")),
                }
            }
            kept.push(name);
        }
    }
    assert!(
        differ.is_empty(),
        "schedules differ from their golden files in {}: {differ:?}; review the change, \
         then PIPEWISE_BLESS=1 cargo test -p pipewise-common --test golden",
        dir.display()
    );
    // No golden file without a generator behind it (a kind renamed or a shape dropped).
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    on_disk.sort();
    kept.sort();
    kept.dedup();
    assert_eq!(
        on_disk, kept,
        "golden files without a generator behind them"
    );
}

/// The golden files read back as the schedules they were written from.
#[test]
fn golden_files_read_back_as_their_schedules() {
    // While the other test writes them, there is nothing settled to read.
    if std::env::var_os("PIPEWISE_BLESS").is_some() {
        return;
    }
    for (kind, (d, n)) in [(ScheduleKind::VHalf, (4, 8)), (ScheduleKind::ZbH2, (2, 4))] {
        let name = format!("{}-d{d}-n{n}.csv", kind.name());
        let text = std::fs::read_to_string(folder().join(&name)).unwrap();
        let read = csv::from_csv(&text, kind.name()).unwrap();
        let generated = generate(&Request::new(kind, d, n)).unwrap();
        assert_eq!(read.workers, generated.workers, "{name}");
    }
}
