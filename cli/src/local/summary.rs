//! `pipewise local`'s account of the steps: running totals for the printed summary and,
//! with `--output-dir`, every step's event appended to `summary.json` as it comes (as
//! [`StepEvent`] serializes), so a long run
//! holds a few numbers per worker rather than one record per step (and the losses of each
//! step for `loss.svg`, [`Curves`]).
//!
//! With `[validation]`, the validation loss before the first step is step 0's record
//! (`{"step": 0, "val_loss": …}`, before step 1's) and the start of the printed
//! `validation loss A → B`.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use pipewise_common::job::JobSpec;
use pipewise_common::run::StepEvent;
use serde::Serialize;

use super::plot::Curves;

/// The steps' times and bubbles: a running sum, or its mean ([`Steps::means`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Times {
    pub(super) step_time_ms: f64,
    pub(super) planned_bubble: f64,
    pub(super) measured_bubble: f64,
    /// The part of `measured_bubble` spent waiting for a core rather than for a peer.
    pub(super) core_wait_bubble: f64,
    /// The part of the workers' time in passes spent waiting for a core.
    pub(super) pass_core_wait: f64,
}

impl Times {
    /// Adds step `e`'s times and bubbles to these.
    fn add(&mut self, e: &StepEvent) {
        self.step_time_ms += e.step_time_ms;
        self.planned_bubble += e.planned_bubble;
        self.measured_bubble += e.measured_bubble;
        self.core_wait_bubble += e.core_wait_bubble;
        self.pass_core_wait += e.pass_core_wait;
    }

    /// These times and bubbles over `n` (the mean of a running sum).
    fn over(&self, n: f64) -> Times {
        Times {
            step_time_ms: self.step_time_ms / n,
            planned_bubble: self.planned_bubble / n,
            measured_bubble: self.measured_bubble / n,
            core_wait_bubble: self.core_wait_bubble / n,
            pass_core_wait: self.pass_core_wait / n,
        }
    }
}

/// Step 0's record of `summary.json`: the validation loss before the first step.
#[derive(Debug, Serialize)]
struct InitialValidation {
    step: u64,
    val_loss: f64,
}

/// `summary.json` being written: `{"job": …, "steps": [` first, a step at a time, and the
/// closing `]}` at the end, under a temporary name until then; and the loss curves, drawn
/// into `loss.svg` beside it at the end.
struct SummaryFile {
    out: BufWriter<File>,
    partial: PathBuf,
    path: PathBuf,
    records: u64,
    curves: Curves,
    /// The job's name, the plot's title.
    name: String,
}

impl SummaryFile {
    /// Appends `record` to the steps.
    fn append(&mut self, record: &impl Serialize) -> Result<()> {
        let sep = if self.records == 0 { "\n" } else { ",\n" };
        write!(self.out, "{sep}{}", serde_json::to_string(record)?)
            .context("cannot write summary.json")?;
        self.records += 1;
        Ok(())
    }
}

/// The name of the loss plot `--output-dir` gets.
pub(super) const LOSS_PLOT: &str = "loss.svg";

/// The steps seen so far (see the [module docs](self)).
pub(super) struct Steps {
    count: u64,
    first_loss: f64,
    last_loss: f64,
    /// The first and the latest validation loss (`None`: no step evaluated).
    val_losses: Option<(f64, f64)>,
    /// The steps' times and bubbles summed.
    sums: Times,
    /// Every worker's largest peak activation bytes.
    peaks: Vec<u64>,
    file: Option<SummaryFile>,
}

impl Steps {
    /// No steps yet; with `dir`, `summary.json` of job `spec` is started there.
    pub(super) fn new(dir: Option<&Path>, spec: &JobSpec) -> Result<Steps> {
        let file = match dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                let path = dir.join("summary.json");
                let partial = dir.join("summary.json.partial");
                let created = File::create(&partial)
                    .with_context(|| format!("cannot write {}", partial.display()))?;
                let mut out = BufWriter::new(created);
                write!(
                    out,
                    "{{\"job\": {},\n\"steps\": [",
                    serde_json::to_string(spec)?
                )?;
                Some(SummaryFile {
                    out,
                    partial,
                    path,
                    records: 0,
                    curves: Curves::default(),
                    name: spec.job.name.clone(),
                })
            }
            None => None,
        };
        Ok(Steps {
            count: 0,
            first_loss: f64::NAN,
            last_loss: f64::NAN,
            val_losses: None,
            sums: Times::default(),
            peaks: Vec::new(),
            file,
        })
    }

    /// The validation loss before the first step, `val` (step 0's record of
    /// `summary.json`): the start of [`Steps::validation_losses`].
    pub(super) fn add_initial_validation(&mut self, val: f64) -> Result<()> {
        self.val_losses = Some((val, val));
        if let Some(f) = &mut self.file {
            f.curves.add_initial_validation(val);
            f.append(&InitialValidation {
                step: 0,
                val_loss: val,
            })?;
        }
        Ok(())
    }

    /// Counts step `s` (and appends it to `summary.json`).
    pub(super) fn add(&mut self, s: &StepEvent) -> Result<()> {
        if self.count == 0 {
            self.first_loss = s.loss;
        }
        self.count += 1;
        self.last_loss = s.loss;
        if let Some(v) = s.validation_loss {
            self.val_losses = Some((self.val_losses.map_or(v, |(first, _)| first), v));
        }
        self.sums.add(s);
        let peaks = s.peak_bytes();
        if self.peaks.len() < peaks.len() {
            self.peaks.resize(peaks.len(), 0);
        }
        for (max, &p) in self.peaks.iter_mut().zip(&peaks) {
            *max = (*max).max(p);
        }
        if let Some(f) = &mut self.file {
            f.curves.add(s.step, s.loss, s.validation_loss);
            f.append(s)?;
        }
        Ok(())
    }

    /// Steps counted.
    pub(super) fn count(&self) -> u64 {
        self.count
    }

    /// The first and the last step's losses (NaN: none).
    pub(super) fn losses(&self) -> (f64, f64) {
        (self.first_loss, self.last_loss)
    }

    /// The first and the latest validation loss (`None`: no step evaluated).
    pub(super) fn validation_losses(&self) -> Option<(f64, f64)> {
        self.val_losses
    }

    /// The steps' mean times and bubbles.
    pub(super) fn means(&self) -> Times {
        self.sums.over(self.count.max(1) as f64)
    }

    /// Worker `w`'s largest peak activation bytes.
    pub(super) fn peak(&self, w: usize) -> u64 {
        self.peaks.get(w).copied().unwrap_or(0)
    }

    /// Closes `summary.json` and gives it its name, and draws `loss.svg` beside it where
    /// there is a loss to draw; returns the names of the files written (none without
    /// `--output-dir`).
    pub(super) fn finish(&mut self) -> Result<Vec<&'static str>> {
        let Some(mut f) = self.file.take() else {
            return Ok(Vec::new());
        };
        f.out
            .write_all(b"\n]}\n")
            .and_then(|()| f.out.flush())
            .context("cannot write summary.json")?;
        std::fs::rename(&f.partial, &f.path).context("cannot write summary.json")?;
        let mut written = vec!["summary.json"];
        if f.curves.any() {
            let plot = f.path.with_file_name(LOSS_PLOT);
            std::fs::write(&plot, f.curves.svg(&f.name))
                .with_context(|| format!("cannot write {}", plot.display()))?;
            written.push(LOSS_PLOT);
        }
        Ok(written)
    }
}

impl Drop for Steps {
    /// A run that did not finish leaves no half-written summary.
    fn drop(&mut self) {
        if let Some(f) = self.file.take() {
            drop(f.out);
            let _ = std::fs::remove_file(&f.partial);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use pipewise_common::job::example;

    /// Step `step`'s event, its `peaks` in worker order given last worker first.
    fn step(step: u64, loss: f64, peaks: &[u64]) -> StepEvent {
        StepEvent {
            job: 1,
            step,
            loss,
            step_time_ms: 10.0 * step as f64,
            planned_bubble: 0.1,
            measured_bubble: 0.2,
            core_wait_bubble: 0.05 * step as f64,
            pass_core_wait: 0.25,
            peaks: (peaks.iter().enumerate().rev())
                .map(|(w, &p)| (u32::try_from(w).unwrap(), p))
                .collect(),
            predicted_step_time_ms: 9.0 * step as f64,
            validation_loss: step.is_multiple_of(2).then_some(loss - 0.5),
            replan_reason: "kept out of the file".into(),
            ..StepEvent::default()
        }
    }

    /// The totals and the streamed file say what a list of every step would.
    #[test]
    fn totals_and_the_file_hold_every_step() {
        let dir = std::env::temp_dir().join(format!("pipewise-summary-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let spec = example(2, "1f1b");
        let mut steps = Steps::new(Some(&dir), &spec).unwrap();
        let all = [
            step(1, 5.0, &[3, 9]),
            step(2, 4.0, &[7, 2]),
            step(3, 3.5, &[1, 1]),
        ];
        for s in &all {
            steps.add(s).unwrap();
        }
        assert_eq!(steps.count(), 3);
        assert_eq!(steps.losses(), (5.0, 3.5));
        // Only step 2 evaluated.
        assert_eq!(steps.validation_losses(), Some((3.5, 3.5)));
        let means = steps.means();
        assert!((means.step_time_ms - 20.0).abs() < 1e-12);
        assert!((means.planned_bubble - 0.1).abs() < 1e-12);
        assert!((means.measured_bubble - 0.2).abs() < 1e-12);
        assert!((means.core_wait_bubble - 0.1).abs() < 1e-12);
        assert!((means.pass_core_wait - 0.25).abs() < 1e-12);
        assert_eq!((steps.peak(0), steps.peak(1), steps.peak(2)), (7, 9, 0));
        assert_eq!(steps.finish().unwrap(), ["summary.json", LOSS_PLOT]);
        let path = dir.join("summary.json");
        assert!(dir.join(LOSS_PLOT).is_file());
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(written["job"], serde_json::to_value(&spec).unwrap());
        assert_eq!(written["steps"], serde_json::to_value(&all).unwrap());
        assert_eq!(written["steps"][1]["val_loss"], 3.5);
        assert_eq!(
            written["steps"][0],
            serde_json::json!({
                "step": 1, "loss": 5.0, "step_time_ms": 10.0, "planned_bubble": 0.1,
                "measured_bubble": 0.2, "core_wait_bubble": 0.05, "pass_core_wait": 0.25,
                "peak_activation_bytes": [3, 9], "predicted_step_time_ms": 9.0,
            })
        );
        assert!(written["steps"][0].get("val_loss").is_none());
        assert!(!dir.join("summary.json.partial").exists());

        // Unfinished: no summary.json, and no partial one left behind.
        std::fs::remove_file(&path).unwrap();
        let mut steps = Steps::new(Some(&dir), &spec).unwrap();
        steps.add(&all[0]).unwrap();
        drop(steps);
        assert!(!path.exists() && !dir.join("summary.json.partial").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The validation loss before the first step is step 0's record, before step 1's, and
    /// where the validation losses start; without `--output-dir` nothing is written.
    #[test]
    fn the_validation_before_the_first_step_is_step_zero() {
        let dir = std::env::temp_dir().join(format!("pipewise-summary-0-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let spec = example(2, "1f1b");
        let mut steps = Steps::new(Some(&dir), &spec).unwrap();
        steps.add_initial_validation(8.25).unwrap();
        assert_eq!(steps.validation_losses(), Some((8.25, 8.25)));
        steps.add(&step(1, 5.0, &[1])).unwrap();
        steps.add(&step(2, 4.0, &[1])).unwrap();
        assert_eq!(steps.count(), 2, "step 0 is no training step");
        assert_eq!(steps.validation_losses(), Some((8.25, 3.5)));
        steps.finish().unwrap();
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        let records = written["steps"].as_array().unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(records[0], serde_json::json!({"step": 0, "val_loss": 8.25}));
        assert_eq!(
            (&records[1]["step"], &records[2]["step"]),
            (&1.into(), &2.into())
        );
        let _ = std::fs::remove_dir_all(&dir);

        let mut quiet = Steps::new(None, &spec).unwrap();
        quiet.add_initial_validation(8.25).unwrap();
        assert_eq!(quiet.finish().unwrap(), Vec::<&str>::new());
        assert!(!dir.exists());
    }
}
