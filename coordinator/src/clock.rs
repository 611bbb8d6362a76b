//! The coordinator's clock: the milliseconds since it started, which the membership's
//! registry, the job manager's scheduler and every run's supervisor are given with each
//! input (those cores hold no clock). A coordinator reads the wall clock; an in-process
//! test harness ([`Coordinator::start_clocked`](crate::Coordinator::start_clocked)) holds a
//! logical one that moves only when it says, so heartbeat expiry and the supervisor's
//! graces happen where a scenario puts them, however loaded the machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The coordinator's clock (see the [module docs](self)).
#[derive(Debug, Clone)]
pub enum Clock {
    /// The wall clock, from this instant.
    Wall(Instant),
    /// Logical milliseconds, moved by [`Clock::advance`].
    Logical(Arc<AtomicU64>),
}

impl Clock {
    /// The wall clock, from now.
    pub fn wall() -> Clock {
        Clock::Wall(Instant::now())
    }

    /// A logical clock at 0.
    pub fn logical() -> Clock {
        Clock::Logical(Arc::new(AtomicU64::new(0)))
    }

    /// Milliseconds since the start.
    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::Wall(epoch) => u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX),
            Clock::Logical(ms) => ms.load(Ordering::SeqCst),
        }
    }

    /// Whether this is a logical clock (an in-process test harness's).
    pub fn is_logical(&self) -> bool {
        matches!(self, Clock::Logical(_))
    }

    /// Moves a logical clock `ms` milliseconds on (the wall clock moves by itself: no-op).
    pub fn advance(&self, ms: u64) {
        if let Clock::Logical(now) = self {
            now.fetch_add(ms, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Clock;

    #[test]
    fn a_logical_clock_moves_only_when_advanced_and_its_copies_with_it() {
        let clock = Clock::logical();
        let copy = clock.clone();
        assert_eq!(clock.now_ms(), 0);
        clock.advance(1_500);
        copy.advance(1);
        assert_eq!((clock.now_ms(), copy.now_ms()), (1_501, 1_501));
        assert!(clock.is_logical() && !Clock::wall().is_logical());
    }
}
