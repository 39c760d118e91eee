//! When the worker's loop takes (docs/worker.md, "Taking in batches"): a pure decision on
//! plain values, no I/O.
//!
//! After a take, the next one is due as soon as `batch` attempts have ended since (one take
//! for several ended attempts instead of one per attempt: the take is the statement the
//! database pays most for per run), or `linger` after the first of them ended, or `poll`
//! after the take; never while every slot is busy. The first take is due at once.

use std::time::{Duration, Instant};

/// The loop's take timing.
#[derive(Debug, Clone)]
pub struct Cadence {
    poll: Duration,
    linger: Duration,
    /// `take_batch`, at most the concurrency.
    batch: usize,
    last_take: Option<Instant>,
    /// Attempts ended since the last take.
    ended: usize,
    first_ended: Option<Instant>,
}

impl Cadence {
    pub fn new(poll: Duration, linger: Duration, batch: u32, concurrency: u32) -> Cadence {
        Cadence {
            poll,
            linger,
            batch: batch.min(concurrency).max(1) as usize,
            last_take: None,
            ended: 0,
            first_ended: None,
        }
    }

    /// Whether to take now, with `free` slots.
    pub fn due(&self, now: Instant, free: usize) -> bool {
        if free == 0 {
            return false;
        }
        let Some(last) = self.last_take else {
            return true;
        };
        self.ended >= self.batch
            || self.first_ended.is_some_and(|f| now >= f + self.linger)
            || now >= last + self.poll
    }

    /// When to look again, with `free` slots, unless an attempt ends first: the next
    /// instant [`due`](Self::due) may turn true (with every slot busy, `poll` from now: the
    /// watchdog is pinged at least that often).
    pub fn wake_at(&self, now: Instant, free: usize) -> Instant {
        let Some(last) = self.last_take.filter(|_| free > 0) else {
            return now + self.poll;
        };
        let mut at = last + self.poll;
        if let Some(f) = self.first_ended {
            at = at.min(f + self.linger);
        }
        at.max(now)
    }

    /// A take was made (whatever it returned).
    pub fn took(&mut self, now: Instant) {
        self.last_take = Some(now);
        self.ended = 0;
        self.first_ended = None;
    }

    /// An attempt ended: its slot is free.
    pub fn ended(&mut self, now: Instant) {
        self.ended += 1;
        self.first_ended.get_or_insert(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn cadence() -> (Cadence, Instant) {
        (Cadence::new(100 * MS, 20 * MS, 16, 64), Instant::now())
    }

    #[test]
    fn the_first_take_is_due_at_once_and_none_while_every_slot_is_busy() {
        let (mut c, t0) = cadence();
        assert!(c.due(t0, 64));
        assert!(!c.due(t0, 0));
        c.took(t0);
        assert!(!c.due(t0 + 500 * MS, 0));
        assert_eq!(c.wake_at(t0 + 500 * MS, 0), t0 + 600 * MS);
    }

    #[test]
    fn a_take_waits_for_the_batch_of_ended_attempts() {
        let (mut c, t0) = cadence();
        c.took(t0);
        for i in 0..15 {
            c.ended(t0 + MS);
            assert!(!c.due(t0 + 2 * MS, i + 1), "after {} ended", i + 1);
        }
        c.ended(t0 + 2 * MS);
        assert!(c.due(t0 + 2 * MS, 16));
        c.took(t0 + 2 * MS);
        assert!(!c.due(t0 + 3 * MS, 16), "the count starts again");
    }

    #[test]
    fn one_ended_attempt_waits_the_linger_at_most() {
        let (mut c, t0) = cadence();
        c.took(t0);
        assert_eq!(c.wake_at(t0, 5), t0 + 100 * MS, "nothing ended: the poll");
        c.ended(t0 + 10 * MS);
        c.ended(t0 + 15 * MS);
        assert_eq!(c.wake_at(t0 + 15 * MS, 2), t0 + 30 * MS);
        assert!(!c.due(t0 + 29 * MS, 2));
        assert!(c.due(t0 + 30 * MS, 2));
    }

    #[test]
    fn the_poll_brings_a_take_when_nothing_ended() {
        let (mut c, t0) = cadence();
        c.took(t0);
        assert!(!c.due(t0 + 99 * MS, 64));
        assert!(c.due(t0 + 100 * MS, 64));
        assert_eq!(
            c.wake_at(t0 + 150 * MS, 64),
            t0 + 150 * MS,
            "never in the past"
        );
    }

    #[test]
    fn the_batch_is_at_most_the_concurrency_and_a_zero_linger_takes_per_ended_attempt() {
        let t0 = Instant::now();
        let mut c = Cadence::new(100 * MS, 20 * MS, 16, 4);
        c.took(t0);
        (0..4).for_each(|_| c.ended(t0));
        assert!(c.due(t0, 4));
        let mut c = Cadence::new(100 * MS, Duration::ZERO, 16, 64);
        c.took(t0);
        c.ended(t0 + MS);
        assert!(c.due(t0 + MS, 1));
    }
}
