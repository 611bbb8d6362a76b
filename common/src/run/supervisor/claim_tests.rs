//! The supervisor on logical time beside other jobs: it runs only on workers no other job
//! holds, claims them before its run, and waits again when another job took one first.

#![allow(clippy::unwrap_used)]

use super::tests::{JOB, assign, spec, supervisor, workers};
use super::*;

fn claimed(id: &str, job: u64) -> Input {
    Input::Claimed { id: id.into(), job }
}

/// With workers 0 and 1 held by job 7, a 2-worker job claims workers 2 and 3 and runs on
/// them once the claim is answered.
#[test]
fn runs_on_the_workers_no_other_job_holds() {
    let spec = spec(2, "1f1b", 6);
    let plan = spec.validate().unwrap();
    let ws = workers(4);
    let mut s = supervisor(&spec, &ws[..2], Start::default());
    assert_eq!(
        s.handle(0, claimed("w0", 7)),
        [
            Action::Waiting("workers: 1 of 2 ready".into()),
            Action::Info("waiting for workers: 1 of 2 ready".into()),
        ]
    );
    // Only other jobs' workers: the job waits.
    assert_eq!(
        s.handle(0, claimed("w1", 7)),
        [Action::Waiting("workers: 0 of 2 ready".into())]
    );
    for w in &ws[2..] {
        s.handle(20, Input::Registered(w.clone()));
    }
    assert_eq!(
        s.handle(30, Input::StreamOpened("w2".into())),
        [Action::Waiting("workers: 1 of 2 ready".into())]
    );
    assert_eq!(
        s.handle(40, Input::StreamOpened("w3".into())),
        [
            Action::Waiting(String::new()),
            Action::Claim(vec!["w2".into(), "w3".into()]),
        ]
    );
    // Nothing starts before the answer.
    assert_eq!(s.handle(50, Input::Tick), []);
    let r0 = RunId::new(JOB, 0);
    assert_eq!(
        s.handle(60, Input::ClaimAnswer(Ok(()))),
        [Action::Attach(r0), assign(r0, 0, &ws[2..], &plan, &[])]
    );
}

/// Another job took a worker between the choice and the claim: the job waits again, and
/// claims the workers free then once it has enough.
#[test]
fn a_refused_claim_waits_again() {
    let spec = spec(2, "1f1b", 6);
    let plan = spec.validate().unwrap();
    let ws = workers(3);
    let mut s = supervisor(&spec, &ws, Start::default());
    assert_eq!(
        s.handle(0, Input::Tick),
        [Action::Claim(vec!["w0".into(), "w1".into()])]
    );
    // Job 7's claim of w0 came first.
    assert_eq!(s.handle(5, claimed("w0", 7)), []);
    assert_eq!(
        s.handle(10, Input::ClaimAnswer(Err(Taken(vec![("w0".into(), 7)])))),
        [
            Action::Info("workers taken: worker w0 is job 7's; waiting".into()),
            Action::Claim(vec!["w1".into(), "w2".into()]),
        ]
    );
    let r0 = RunId::new(JOB, 0);
    assert_eq!(
        s.handle(20, Input::ClaimAnswer(Ok(()))),
        [Action::Attach(r0), assign(r0, 0, &ws[1..], &plan, &[])]
    );
}

/// A refusal names every worker taken, with its job, in the order claimed.
#[test]
fn a_refusal_names_each_taken_worker() {
    let taken = Taken(vec![("w0".into(), 7), ("w3".into(), 2)]);
    assert_eq!(
        taken.to_string(),
        "worker w0 is job 7's, worker w3 is job 2's"
    );
}
