//! A training job: what a user submits (TOML, field names in torchtitan's spirit), its
//! validation and planning. Every rejected field comes back as
//! [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) naming the field
//! (`section.key`) and the reason; the gRPC edge turns that into `InvalidArgument`.
//!
//! ```toml
//! [job]
//! name = "tiny"
//!
//! [model]
//! vocab = 256
//! hidden = 64
//! heads = 4
//! layers = 8
//! seq_len = 32
//! dtype = "f32"
//!
//! [training]
//! global_batch_size = 8
//! steps = 50
//! seed = 42
//! max_norm = 1.0
//!
//! [optimizer]
//! lr = 3e-3
//!
//! [lr_scheduler]            # optional; absent = optimizer.lr at every step
//! warmup_steps = 5            # torchtitan's names and arithmetic (see `lr`)
//! decay_type = "cosine"       # "linear" (default), "sqrt" or "cosine"
//! min_lr_factor = 0.1
//!
//! [parallelism]
//! pipeline_parallel_degree = 4
//! pipeline_parallel_schedule = "v-half"     # any `pipewise plan` schedule
//! pipeline_parallel_microbatch_size = 1     # microbatches = global_batch_size / this
//! pipeline_parallel_first_stage_less_layers = 1   # optional, torchtitan's layer split
//! pipeline_parallel_last_stage_less_layers = 1    # (default: workers' compute balanced)
//!
//! [data]                    # optional; absent = the generated corpus, shuffled
//! path = "corpus.txt"       # under the workers' data directories: a text file, a folder
//!                           # of *.txt, JSON Lines (.jsonl) or token ids (.bin)
//! tokenizer = "tokenizer.json"  # optional Hugging Face tokenizer; absent = a byte a token
//! token_bytes = 2           # bytes per id of a .bin file: 2 (default) or 4
//! shuffle = false           # windows in the corpus's order (default: seeded, per epoch)
//!
//! [checkpoint]
//! enable_checkpoint = true
//! folder = "checkpoints"
//! interval = 10
//!
//! [validation]              # optional; absent = no validation loss
//! path = "valid.txt"        # read as [data] path is; or fraction = 0.1: the training
//!                           # stream's last tenth of windows held out
//! freq = 10                 # evaluate every 10 optimizer steps and after the last
//! steps = -1                # batches of global_batch_size windows; -1: every window
//!
//! [compute]                 # optional; absent = real compute
//! mode = "emulate"          # "real" (candle stage compute) or "emulate"
//! f_ms = 10.0               # emulated pass times of one stage of 1/d of the model
//! b_ms = 10.0
//! w_ms = 10.0
//! ```
//!
//! With `mode = "emulate"` a worker runs its program without candle: every pass sleeps for
//! the cost model's duration of it (`Costs::uniform` over the job's placement with these
//! times, so a V or interleaved chunk pass takes `1/v` of them) and the frames between
//! workers are real buffers of the true activation size. The planned bubble (and the
//! schedule's cost-aware reordering) then use these times.
//!
//! # Files
//!
//! - [`spec`]: the schema (sections, fields, defaults, TOML form);
//! - `check`: field validation;
//! - `activation`: `[activation_checkpoint]`, each stage's activation recomputation;
//! - [`confine()`]: the job's paths confined to a data directory, and caps on free text;
//! - [`plan`]: planning a job's schedule ([`plan_job`], [`JobPlan`]);
//! - `memory`: the memory a planned job is predicted to take on each worker;
//! - [`layout`]: checkpoint folder names and run ids.
//! - [`parse_count`]: how many times tests saw a job's TOML parsed.
//! - [`lr`]: `[lr_scheduler]`, the learning rate of each step.
//! - `validation`: `[validation]`, the held-out loss measured during training.

mod activation;
mod check;
pub mod confine;
pub mod layout;
pub mod lr;
mod memory;
pub mod parse_count;
pub mod plan;
pub mod spec;
mod validation;

pub use activation::{AUTO_RECOMPUTE, ActivationCheckpoint, RecomputeRequest};
pub use confine::{Found, MAX_PATH_BYTES, check_links, check_text, confine};
pub use layout::{
    FINAL_CHECKPOINT, checkpoint_dir, checkpoint_file, checkpoint_file_name, checkpoint_name,
    checkpoint_step, final_dir, final_file, final_file_name, job_dir, job_of, run_id, run_of,
};
pub use plan::{JobPlan, plan_job};
pub use spec::DEFAULT_VALIDATION_FREQ;
pub use spec::{
    AUTO_SCHEDULE, Checkpoint, Compute, ComputeMode, Data, JobSection, JobSpec,
    MAX_DESCRIPTION_BYTES, MAX_EMULATED_PASS_MS, MAX_FRAME_BYTES, MAX_JOB_TOML_BYTES,
    MAX_NAME_BYTES, MIN_EMULATED_PASS_MS, Optimizer, Parallelism, Training, Validation, example,
};
