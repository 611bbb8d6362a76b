//! Placements: which worker holds which pipeline stage.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// How stages are laid out over workers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Placement {
    /// One stage per worker: stage `s` on worker `s`.
    OnePerWorker {
        /// Worker count `d` (= stage count).
        workers: u32,
    },
    /// Interleaved ("loop"): `chunks × d` stages, stage `s` on worker `s mod d`.
    Loop {
        /// Worker count `d`.
        workers: u32,
        /// Stages per worker `v`.
        chunks: u32,
    },
    /// V shape: `2d` stages, worker `i` holds stages `i` and `2d − 1 − i`.
    V {
        /// Worker count `d`.
        workers: u32,
    },
    /// Any explicit stage → worker table (e.g. from an imported schedule).
    Explicit {
        /// `worker_of[s]` is the worker of stage `s`.
        worker_of: Vec<u32>,
        /// Worker count.
        workers: u32,
    },
}

impl Placement {
    /// Checks the shape (at least one worker, one chunk; explicit tables in range).
    pub fn check(&self) -> Result<(), Error> {
        let workers = self.workers();
        if workers == 0 {
            return Err(Error::InvalidArgument {
                field: "workers",
                reason: "must be at least 1".into(),
            });
        }
        match self {
            Placement::Loop { chunks: 0, .. } => Err(Error::InvalidArgument {
                field: "chunks",
                reason: "must be at least 1".into(),
            }),
            Placement::Explicit { worker_of, .. } => {
                if let Some((stage, &w)) =
                    worker_of.iter().enumerate().find(|(_, w)| **w >= workers)
                {
                    return Err(Error::InvalidArgument {
                        field: "placement",
                        reason: format!(
                            "stage {stage} is placed on worker {w}, but there are only {workers} workers"
                        ),
                    });
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Worker count.
    pub fn workers(&self) -> u32 {
        match self {
            Placement::OnePerWorker { workers }
            | Placement::Loop { workers, .. }
            | Placement::V { workers }
            | Placement::Explicit { workers, .. } => *workers,
        }
    }

    /// Stage count.
    pub fn stages(&self) -> u32 {
        match self {
            Placement::OnePerWorker { workers } => *workers,
            Placement::Loop { workers, chunks } => workers * chunks,
            Placement::V { workers } => 2 * workers,
            Placement::Explicit { worker_of, .. } => worker_of.len() as u32,
        }
    }

    /// Stages held by each worker (`v` in the `--times` convention); the largest count for
    /// explicit tables.
    pub fn chunks(&self) -> u32 {
        match self {
            Placement::OnePerWorker { .. } => 1,
            Placement::Loop { chunks, .. } => *chunks,
            Placement::V { .. } => 2,
            Placement::Explicit { .. } => (0..self.workers())
                .map(|w| self.stages_of(w).len() as u32)
                .max()
                .unwrap_or(1)
                .max(1),
        }
    }

    /// The worker holding `stage`. `stage` must be `< stages()`.
    pub fn worker_of(&self, stage: u32) -> u32 {
        match self {
            Placement::OnePerWorker { .. } => stage,
            Placement::Loop { workers, .. } => stage % workers,
            Placement::V { workers } => {
                if stage < *workers {
                    stage
                } else {
                    2 * workers - 1 - stage
                }
            }
            Placement::Explicit { worker_of, .. } => worker_of[stage as usize],
        }
    }

    /// The stages of `worker`, in increasing order.
    pub fn stages_of(&self, worker: u32) -> Vec<u32> {
        (0..self.stages())
            .filter(|&s| self.worker_of(s) == worker)
            .collect()
    }

    /// The full stage → worker table.
    pub fn table(&self) -> Vec<u32> {
        (0..self.stages()).map(|s| self.worker_of(s)).collect()
    }

    /// Recognises a table as one of the named shapes, else `Explicit`.
    pub fn from_table(worker_of: Vec<u32>, workers: u32) -> Placement {
        let candidates = [
            Placement::OnePerWorker { workers },
            Placement::V { workers },
            Placement::Loop {
                workers,
                chunks: (worker_of.len() as u32).div_ceil(workers.max(1)).max(1),
            },
        ];
        candidates
            .into_iter()
            .find(|p| p.stages() as usize == worker_of.len() && p.table() == worker_of)
            .unwrap_or(Placement::Explicit { worker_of, workers })
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::OnePerWorker { .. } => f.write_str("one-per-worker"),
            Placement::Loop { chunks, .. } => write!(f, "loop(v={chunks})"),
            Placement::V { .. } => f.write_str("v"),
            Placement::Explicit { .. } => f.write_str("explicit"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_pairs_first_and_last() {
        let p = Placement::V { workers: 4 };
        assert_eq!(p.table(), vec![0, 1, 2, 3, 3, 2, 1, 0]);
        assert_eq!(p.stages_of(0), vec![0, 7]);
        assert_eq!(p.stages_of(3), vec![3, 4]);
    }

    #[test]
    fn loop_wraps() {
        let p = Placement::Loop {
            workers: 3,
            chunks: 2,
        };
        assert_eq!(p.table(), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(p.chunks(), 2);
    }

    #[test]
    fn from_table_recognises_shapes() {
        assert_eq!(
            Placement::from_table(vec![0, 1, 1, 0], 2),
            Placement::V { workers: 2 }
        );
        assert_eq!(
            Placement::from_table(vec![0, 1, 0, 1], 2),
            Placement::Loop {
                workers: 2,
                chunks: 2
            }
        );
        assert!(matches!(
            Placement::from_table(vec![1, 0], 2),
            Placement::Explicit { .. }
        ));
        assert!(
            Placement::Explicit {
                worker_of: vec![0, 5],
                workers: 2
            }
            .check()
            .is_err()
        );
    }
}
