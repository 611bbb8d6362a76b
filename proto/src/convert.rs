//! Conversions between the `pipewise.v1` messages and the planning core's types.
//!
//! Core → proto never fails ([`From`]); proto → core checks every field
//! ([`TryFrom`]) and names the offending one in [`ConvertError`]. A worker's step report and
//! a job's step event are in [`step`].

use pipewise_common::generate::{MAX_CHUNKS, MAX_WORKERS};
use pipewise_common::model::{DEFAULT_NORM_EPS, DEFAULT_ROPE_THETA, DType, Family, ModelSpec};
use pipewise_common::trace::{Activity, Span};
use pipewise_common::{Pass, PassKind, Placement};

use crate::v1;

pub mod step;

/// A message that does not describe a valid core value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// An enum field holds a number the schema does not define.
    #[error("{field}: unknown enum value {value}")]
    UnknownEnum {
        /// The field (`Pass.kind`, `Placement.kind`, ...).
        field: &'static str,
        /// The number found.
        value: i32,
    },
    /// An enum field is left at its `*_UNSPECIFIED` zero value.
    #[error("{field}: not set")]
    Unspecified {
        /// The field.
        field: &'static str,
    },
    /// A required message field is missing.
    #[error("{field}: missing")]
    Missing {
        /// The field.
        field: &'static str,
    },
    /// A field's value is out of range or contradicts another field.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },
}

// === PassKind ===

impl From<PassKind> for v1::PassKind {
    fn from(kind: PassKind) -> Self {
        match kind {
            PassKind::F => v1::PassKind::F,
            PassKind::B => v1::PassKind::B,
            PassKind::W => v1::PassKind::W,
            PassKind::BW => v1::PassKind::Bw,
        }
    }
}

/// Reads a `PassKind` enum field (`field` names it in errors).
pub fn pass_kind(value: i32, field: &'static str) -> Result<PassKind, ConvertError> {
    match v1::PassKind::try_from(value) {
        Ok(v1::PassKind::F) => Ok(PassKind::F),
        Ok(v1::PassKind::B) => Ok(PassKind::B),
        Ok(v1::PassKind::W) => Ok(PassKind::W),
        Ok(v1::PassKind::Bw) => Ok(PassKind::BW),
        Ok(v1::PassKind::Unspecified) => Err(ConvertError::Unspecified { field }),
        Err(_) => Err(ConvertError::UnknownEnum { field, value }),
    }
}

// === Pass ===

impl From<Pass> for v1::Pass {
    fn from(pass: Pass) -> Self {
        v1::Pass {
            kind: v1::PassKind::from(pass.kind) as i32,
            stage: pass.stage,
            mb: pass.mb,
        }
    }
}

impl TryFrom<v1::Pass> for Pass {
    type Error = ConvertError;

    fn try_from(pass: v1::Pass) -> Result<Self, Self::Error> {
        Ok(Pass::new(
            pass_kind(pass.kind, "Pass.kind")?,
            pass.stage,
            pass.mb,
        ))
    }
}

/// A worker's program (its passes of one step, in order) as messages.
pub fn program_to_proto(program: &[Pass]) -> Vec<v1::Pass> {
    program.iter().map(|&p| p.into()).collect()
}

/// A worker's program from messages; the first bad pass fails the whole program.
pub fn program_from_proto(program: Vec<v1::Pass>) -> Result<Vec<Pass>, ConvertError> {
    program.into_iter().map(Pass::try_from).collect()
}

// === Trace spans ===

impl From<&Span> for v1::TraceSpan {
    fn from(span: &Span) -> Self {
        let (kind, pass, peer, stage) = match span.activity {
            Activity::Pass(p) => (v1::SpanKind::Pass, Some(p.into()), 0, 0),
            Activity::Recv { pass, peer } => (v1::SpanKind::Recv, Some(pass.into()), peer, 0),
            Activity::Send { pass, peer } => (v1::SpanKind::Send, Some(pass.into()), peer, 0),
            Activity::Sync => (v1::SpanKind::Sync, None, 0, 0),
            Activity::AllReduce { stage } => (v1::SpanKind::AllReduce, None, 0, stage),
        };
        v1::TraceSpan {
            kind: kind as i32,
            pass,
            peer,
            stage,
            start: span.start,
            end: span.end,
        }
    }
}

impl TryFrom<v1::TraceSpan> for Span {
    type Error = ConvertError;

    fn try_from(span: v1::TraceSpan) -> Result<Self, Self::Error> {
        let pass = |p: Option<v1::Pass>| {
            p.ok_or(ConvertError::Missing {
                field: "TraceSpan.pass",
            })
            .and_then(Pass::try_from)
        };
        let activity = match v1::SpanKind::try_from(span.kind) {
            Ok(v1::SpanKind::Pass) => Activity::Pass(pass(span.pass)?),
            Ok(v1::SpanKind::Recv) => Activity::Recv {
                pass: pass(span.pass)?,
                peer: span.peer,
            },
            Ok(v1::SpanKind::Send) => Activity::Send {
                pass: pass(span.pass)?,
                peer: span.peer,
            },
            Ok(v1::SpanKind::Sync) => Activity::Sync,
            Ok(v1::SpanKind::AllReduce) => Activity::AllReduce { stage: span.stage },
            Ok(v1::SpanKind::Unspecified) => {
                return Err(ConvertError::Unspecified {
                    field: "TraceSpan.kind",
                });
            }
            Err(_) => {
                return Err(ConvertError::UnknownEnum {
                    field: "TraceSpan.kind",
                    value: span.kind,
                });
            }
        };
        if !span.start.is_finite() || !span.end.is_finite() || span.end < span.start {
            return Err(ConvertError::Invalid {
                field: "TraceSpan.end",
                reason: format!(
                    "span [{}, {}] is not a finite interval",
                    span.start, span.end
                ),
            });
        }
        Ok(Span {
            activity,
            start: span.start,
            end: span.end,
        })
    }
}

// === Placement ===

impl From<&Placement> for v1::Placement {
    fn from(placement: &Placement) -> Self {
        let (kind, chunks) = match placement {
            Placement::OnePerWorker { .. } => (v1::PlacementKind::OnePerWorker, 0),
            Placement::Loop { chunks, .. } => (v1::PlacementKind::Loop, *chunks),
            Placement::V { .. } => (v1::PlacementKind::V, 0),
            Placement::Explicit { .. } => (v1::PlacementKind::Explicit, 0),
        };
        v1::Placement {
            kind: kind as i32,
            workers: placement.workers(),
            chunks,
            worker_of: placement.table(),
        }
    }
}

impl From<Placement> for v1::Placement {
    fn from(placement: Placement) -> Self {
        (&placement).into()
    }
}

impl TryFrom<v1::Placement> for Placement {
    type Error = ConvertError;

    fn try_from(msg: v1::Placement) -> Result<Self, Self::Error> {
        let workers = msg.workers;
        // Bounded before any stage count is computed or table built (found by fuzzing:
        // `u32::MAX` workers overflowed the stage count, or built a 4-billion-entry table).
        let too_large = |field, value: usize, max: u32| ConvertError::Invalid {
            field,
            reason: format!("{value} is over the {max} pipewise plans"),
        };
        if workers > MAX_WORKERS {
            return Err(too_large(
                "Placement.workers",
                workers as usize,
                MAX_WORKERS,
            ));
        }
        if msg.chunks > MAX_CHUNKS {
            return Err(too_large(
                "Placement.chunks",
                msg.chunks as usize,
                MAX_CHUNKS,
            ));
        }
        if msg.worker_of.len() > (MAX_WORKERS * MAX_CHUNKS) as usize {
            return Err(too_large(
                "Placement.worker_of",
                msg.worker_of.len(),
                MAX_WORKERS * MAX_CHUNKS,
            ));
        }
        let placement = match v1::PlacementKind::try_from(msg.kind) {
            Ok(v1::PlacementKind::OnePerWorker) => Placement::OnePerWorker { workers },
            Ok(v1::PlacementKind::Loop) => Placement::Loop {
                workers,
                chunks: msg.chunks,
            },
            Ok(v1::PlacementKind::V) => Placement::V { workers },
            Ok(v1::PlacementKind::Explicit) => Placement::Explicit {
                worker_of: msg.worker_of.clone(),
                workers,
            },
            Ok(v1::PlacementKind::Unspecified) => {
                return Err(ConvertError::Unspecified {
                    field: "Placement.kind",
                });
            }
            Err(_) => {
                return Err(ConvertError::UnknownEnum {
                    field: "Placement.kind",
                    value: msg.kind,
                });
            }
        };
        placement.check().map_err(|e| ConvertError::Invalid {
            field: match &e {
                pipewise_common::Error::InvalidArgument {
                    field: "chunks", ..
                } => "Placement.chunks",
                pipewise_common::Error::InvalidArgument {
                    field: "workers", ..
                } => "Placement.workers",
                _ => "Placement.worker_of",
            },
            reason: e.to_string(),
        })?;
        // The table is always sent; for named shapes it must agree with the shape.
        if !msg.worker_of.is_empty() && msg.worker_of != placement.table() {
            return Err(ConvertError::Invalid {
                field: "Placement.worker_of",
                reason: format!(
                    "table {:?} is not the {placement} table {:?}",
                    msg.worker_of,
                    placement.table()
                ),
            });
        }
        Ok(placement)
    }
}

// === DType and ModelSpec ===

impl From<DType> for v1::Dtype {
    fn from(dtype: DType) -> Self {
        match dtype {
            DType::F32 => v1::Dtype::F32,
            DType::F16 => v1::Dtype::F16,
            DType::BF16 => v1::Dtype::Bf16,
        }
    }
}

/// Reads a `Dtype` enum field (`field` names it in errors).
pub fn dtype(value: i32, field: &'static str) -> Result<DType, ConvertError> {
    match v1::Dtype::try_from(value) {
        Ok(v1::Dtype::F32) => Ok(DType::F32),
        Ok(v1::Dtype::F16) => Ok(DType::F16),
        Ok(v1::Dtype::Bf16) => Ok(DType::BF16),
        Ok(v1::Dtype::Unspecified) => Err(ConvertError::Unspecified { field }),
        Err(_) => Err(ConvertError::UnknownEnum { field, value }),
    }
}

impl From<&ModelSpec> for v1::ModelSpec {
    fn from(spec: &ModelSpec) -> Self {
        v1::ModelSpec {
            vocab: spec.vocab,
            hidden: spec.hidden,
            heads: spec.heads,
            layers: spec.layers,
            seq_len: spec.seq_len,
            dtype: v1::Dtype::from(spec.dtype) as i32,
            family: match spec.family {
                Family::Gpt => v1::ModelFamily::Gpt,
                Family::Llama => v1::ModelFamily::Llama,
            } as i32,
            kv_heads: spec.kv_heads,
            intermediate: spec.intermediate,
            rope_theta: spec.rope_theta,
            norm_eps: spec.norm_eps,
            tie_embeddings: spec.tie_embeddings,
            path: spec.path.clone(),
        }
    }
}

impl TryFrom<v1::ModelSpec> for ModelSpec {
    type Error = ConvertError;

    fn try_from(msg: v1::ModelSpec) -> Result<Self, Self::Error> {
        let spec = ModelSpec {
            vocab: msg.vocab,
            hidden: msg.hidden,
            heads: msg.heads,
            layers: msg.layers,
            seq_len: msg.seq_len,
            dtype: dtype(msg.dtype, "ModelSpec.dtype")?,
            family: match v1::ModelFamily::try_from(msg.family) {
                Ok(v1::ModelFamily::Unspecified | v1::ModelFamily::Gpt) => Family::Gpt,
                Ok(v1::ModelFamily::Llama) => Family::Llama,
                Err(_) => {
                    return Err(ConvertError::UnknownEnum {
                        field: "ModelSpec.family",
                        value: msg.family,
                    });
                }
            },
            kv_heads: msg.kv_heads,
            intermediate: msg.intermediate,
            rope_theta: if msg.rope_theta == 0.0 {
                DEFAULT_ROPE_THETA
            } else {
                msg.rope_theta
            },
            norm_eps: if msg.norm_eps == 0.0 {
                DEFAULT_NORM_EPS
            } else {
                msg.norm_eps
            },
            tie_embeddings: msg.tie_embeddings,
            path: msg.path,
        };
        spec.validate().map_err(|e| ConvertError::Invalid {
            field: match &e {
                pipewise_common::Error::InvalidArgument { field, .. } => match *field {
                    "vocab" => "ModelSpec.vocab",
                    "hidden" => "ModelSpec.hidden",
                    "heads" => "ModelSpec.heads",
                    "layers" => "ModelSpec.layers",
                    "seq_len" => "ModelSpec.seq_len",
                    "kv_heads" => "ModelSpec.kv_heads",
                    "intermediate" => "ModelSpec.intermediate",
                    "rope_theta" => "ModelSpec.rope_theta",
                    "norm_eps" => "ModelSpec.norm_eps",
                    "tie_embeddings" => "ModelSpec.tie_embeddings",
                    _ => "ModelSpec",
                },
                _ => "ModelSpec",
            },
            reason: e.to_string(),
        })?;
        Ok(spec)
    }
}

// === Raw protobuf, for hand-written codecs ===

/// The protobuf encoding of `message`, for codecs outside this crate that write part of a
/// message themselves (the activation transport appends `TensorFrame.data` straight from
/// tensor memory after the other fields).
pub fn encode_message(message: &impl prost::Message) -> Vec<u8> {
    message.encode_to_vec()
}

/// Decodes a protobuf message of type `M` from `bytes` (`field` names it in errors).
pub fn decode_message<M: prost::Message + Default>(
    bytes: &[u8],
    field: &'static str,
) -> Result<M, ConvertError> {
    M::decode(bytes).map_err(|e| ConvertError::Invalid {
        field,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_round_trips() {
        for kind in PassKind::ALL {
            for (stage, mb) in [(0, 0), (3, 17), (u32::MAX, u32::MAX)] {
                let pass = Pass::new(kind, stage, mb);
                let msg = v1::Pass::from(pass);
                assert_eq!(Pass::try_from(msg), Ok(pass));
            }
        }
    }

    #[test]
    fn program_round_trips() {
        let program = vec![Pass::f(0, 0), Pass::f(7, 0), Pass::b(7, 0), Pass::w(7, 0)];
        let msgs = program_to_proto(&program);
        assert_eq!(program_from_proto(msgs), Ok(program));
    }

    #[test]
    fn trace_spans_round_trip_and_bad_ones_name_the_field() {
        let spans = [
            Span {
                activity: Activity::Pass(Pass::f(2, 5)),
                start: 1.5,
                end: 2.0,
            },
            Span {
                activity: Activity::Recv {
                    pass: Pass::b(1, 0),
                    peer: 3,
                },
                start: 2.0,
                end: 2.25,
            },
            Span {
                activity: Activity::Send {
                    pass: Pass::f(0, 1),
                    peer: 1,
                },
                start: 3.0,
                end: 3.0,
            },
            Span {
                activity: Activity::Sync,
                start: 4.0,
                end: 5.0,
            },
            Span {
                activity: Activity::AllReduce { stage: 6 },
                start: 3.5,
                end: 4.5,
            },
        ];
        for span in spans {
            assert_eq!(Span::try_from(v1::TraceSpan::from(&span)), Ok(span));
        }
        let mut backwards = v1::TraceSpan::from(&spans[0]);
        backwards.end = 1.0;
        let err = Span::try_from(backwards).expect_err("end before start");
        assert!(err.to_string().starts_with("TraceSpan.end"), "{err}");
        let mut no_pass = v1::TraceSpan::from(&spans[1]);
        no_pass.pass = None;
        assert_eq!(
            Span::try_from(no_pass),
            Err(ConvertError::Missing {
                field: "TraceSpan.pass"
            })
        );
        let mut unknown = v1::TraceSpan::from(&spans[3]);
        unknown.kind = 99;
        assert!(Span::try_from(unknown).is_err());
    }

    #[test]
    fn bad_pass_kind_names_the_field() {
        let unknown = v1::Pass {
            kind: 42,
            stage: 0,
            mb: 0,
        };
        assert_eq!(
            Pass::try_from(unknown),
            Err(ConvertError::UnknownEnum {
                field: "Pass.kind",
                value: 42
            })
        );
        let unset = v1::Pass::default();
        let err = Pass::try_from(unset).expect_err("unspecified kind");
        assert_eq!(err, ConvertError::Unspecified { field: "Pass.kind" });
        assert!(err.to_string().contains("Pass.kind"), "{err}");
    }

    #[test]
    fn placement_round_trips() {
        let placements = [
            Placement::OnePerWorker { workers: 4 },
            Placement::Loop {
                workers: 3,
                chunks: 2,
            },
            Placement::V { workers: 4 },
            Placement::Explicit {
                worker_of: vec![1, 0, 0, 1, 1],
                workers: 2,
            },
        ];
        for placement in placements {
            let msg = v1::Placement::from(&placement);
            assert_eq!(msg.worker_of, placement.table());
            assert_eq!(Placement::try_from(msg), Ok(placement));
        }
    }

    #[test]
    fn oversized_placements_are_refused_before_sizing_anything() {
        // Found by fuzzing: these overflowed the stage count or built a huge table.
        let cases = [
            (
                v1::PlacementKind::V,
                u32::MAX,
                0,
                vec![],
                "Placement.workers",
            ),
            (
                v1::PlacementKind::OnePerWorker,
                1 << 31,
                0,
                vec![0],
                "Placement.workers",
            ),
            (
                v1::PlacementKind::Loop,
                4,
                u32::MAX,
                vec![],
                "Placement.chunks",
            ),
            (
                v1::PlacementKind::Explicit,
                2,
                0,
                vec![0; 1 << 20],
                "Placement.worker_of",
            ),
        ];
        for (kind, workers, chunks, worker_of, field) in cases {
            let msg = v1::Placement {
                kind: kind as i32,
                workers,
                chunks,
                worker_of,
            };
            match Placement::try_from(msg) {
                Err(ConvertError::Invalid { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{kind:?} {workers} {chunks}: {other:?}"),
            }
        }
        let most = v1::Placement::from(Placement::Loop {
            workers: MAX_WORKERS,
            chunks: MAX_CHUNKS,
        });
        assert!(Placement::try_from(most).is_ok());
    }

    #[test]
    fn bad_placements_name_the_field() {
        let field_of = |msg: v1::Placement| match Placement::try_from(msg) {
            Err(
                ConvertError::Invalid { field, .. }
                | ConvertError::Unspecified { field }
                | ConvertError::UnknownEnum { field, .. }
                | ConvertError::Missing { field },
            ) => field,
            Ok(p) => panic!("accepted {p:?}"),
        };
        let v = v1::Placement::from(Placement::V { workers: 2 });
        assert_eq!(
            field_of(v1::Placement {
                kind: 0,
                ..v.clone()
            }),
            "Placement.kind"
        );
        assert_eq!(
            field_of(v1::Placement {
                kind: 9,
                ..v.clone()
            }),
            "Placement.kind"
        );
        assert_eq!(
            field_of(v1::Placement {
                workers: 0,
                worker_of: vec![],
                ..v.clone()
            }),
            "Placement.workers"
        );
        assert_eq!(
            field_of(v1::Placement {
                worker_of: vec![0, 1, 0, 1],
                ..v.clone()
            }),
            "Placement.worker_of"
        );
        assert_eq!(
            field_of(v1::Placement {
                kind: v1::PlacementKind::Loop as i32,
                chunks: 0,
                worker_of: vec![],
                ..v.clone()
            }),
            "Placement.chunks"
        );
        assert_eq!(
            field_of(v1::Placement {
                kind: v1::PlacementKind::Explicit as i32,
                worker_of: vec![0, 5],
                ..v
            }),
            "Placement.worker_of"
        );
    }

    #[test]
    fn model_spec_round_trips_and_checks() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let spec = ModelSpec {
                vocab: 256,
                hidden: 64,
                heads: 4,
                layers: 2,
                seq_len: 32,
                dtype,
                ..Default::default()
            };
            let msg = v1::ModelSpec::from(&spec);
            assert_eq!(ModelSpec::try_from(msg), Ok(spec));
        }
        // Every Llama field crosses the wire.
        let llama = ModelSpec {
            family: Family::Llama,
            kv_heads: Some(2),
            intermediate: Some(96),
            rope_theta: 500_000.0,
            norm_eps: 1e-6,
            tie_embeddings: true,
            ..Default::default()
        };
        let msg = v1::ModelSpec::from(&llama);
        assert_eq!(ModelSpec::try_from(msg), Ok(llama));
        let gqa = v1::ModelSpec {
            kv_heads: Some(3),
            ..v1::ModelSpec::from(&ModelSpec {
                family: Family::Llama,
                ..Default::default()
            })
        };
        assert!(matches!(
            ModelSpec::try_from(gqa),
            Err(ConvertError::Invalid {
                field: "ModelSpec.kv_heads",
                ..
            })
        ));
        let bad = v1::ModelSpec {
            vocab: 256,
            hidden: 64,
            heads: 5,
            layers: 2,
            seq_len: 32,
            dtype: v1::Dtype::F32 as i32,
            ..Default::default()
        };
        assert!(matches!(
            ModelSpec::try_from(bad.clone()),
            Err(ConvertError::Invalid {
                field: "ModelSpec.heads",
                ..
            })
        ));
        let no_dtype = v1::ModelSpec { dtype: 0, ..bad };
        assert_eq!(
            ModelSpec::try_from(no_dtype),
            Err(ConvertError::Unspecified {
                field: "ModelSpec.dtype"
            })
        );
    }
}
