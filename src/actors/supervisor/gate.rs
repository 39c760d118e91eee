//! The round gate (when a round may start) and the strikes per trigger (how a row's failures
//! count): the supervisor's pure state, tested without an actor system.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::actors::claim::Report;
use crate::engine::Outcome;
use crate::store::admission::Refusal;

/// Whether a claim statement is in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    Idle,
    /// The claim statement runs (on the round connection, moved into its future).
    Claiming,
}

/// When the next round starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// At the next timer tick.
    AtCadence,
    /// As soon as no claim actor is alive (more is due right now).
    AtOnce,
}

/// The round state and the catch-up signal, and every transition between them. The signal
/// is raised by events (a filled round, a row due again) and cleared only by starting a
/// round, so no event can wipe a pending one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundGate {
    round: Round,
    next: Next,
}

impl Default for RoundGate {
    fn default() -> Self {
        RoundGate {
            round: Round::Idle,
            next: Next::AtCadence,
        }
    }
}

impl RoundGate {
    /// A round may start now (none in flight).
    pub fn idle(&self) -> bool {
        self.round == Round::Idle
    }
    /// A round started: it takes the pending signal with it.
    pub fn started(&mut self) {
        self.round = Round::Claiming;
        self.next = Next::AtCadence;
    }
    /// The round's statement ended; `filled` = it leased its whole budget.
    pub fn round_done(&mut self, filled: bool) {
        self.round = Round::Idle;
        if filled {
            self.next = Next::AtOnce;
        }
    }
    /// A claim actor's row is due again right now.
    pub fn due_again(&mut self) {
        self.next = Next::AtOnce;
    }
    /// Whether to start a round now, without waiting for the timer.
    pub fn start_at_once(&self, live_claims: usize) -> bool {
        self.idle() && live_claims == 0 && self.next == Next::AtOnce
    }
}

/// Consecutive strikes of one trigger's rows here: claim-actor crashes (respawned up to three
/// times) and admission errors of the row (each doubles its error back-off). Bounded: an
/// entry not struck for [`crate::actors::Settings::strike_memory`] is forgotten, since a row still ours
/// would have come back within it (its back-off and a lease); a deleted trigger or one
/// another replica took over leaves no entry behind.
#[derive(Debug, Default)]
pub struct Strikes {
    restarts: HashMap<String, (u32, Instant)>,
    failures: HashMap<String, (u32, Instant)>,
}

impl Strikes {
    /// Consecutive admission errors of this trigger's row.
    pub fn failures(&self, trigger: &str) -> u32 {
        self.failures.get(trigger).map_or(0, |e| e.0)
    }

    /// A claim actor crashed: the number of crashes in a row.
    pub fn crashed(&mut self, trigger: &str, now: Instant) -> u32 {
        strike(&mut self.restarts, trigger, now)
    }

    /// A claim actor reported. A definite outcome clears both counts, except an
    /// `Unexplained` refusal, which is an error of the row (its back-off grows); a lost
    /// fence clears them too (the row is no longer ours). A row error strikes; an outage or
    /// an unknown outcome leaves the counts as they are.
    pub fn reported(&mut self, trigger: &str, report: &Report, now: Instant) {
        match report {
            Report::Done(Outcome::Refused(Refusal::Unexplained)) => {
                self.restarts.remove(trigger);
                strike(&mut self.failures, trigger, now);
            }
            Report::Done(_) => {
                self.restarts.remove(trigger);
                self.failures.remove(trigger);
            }
            Report::Failed(e) if e.is_row_error() => {
                strike(&mut self.failures, trigger, now);
            }
            Report::Failed(_) | Report::Crashed { .. } => {}
        }
    }

    /// Drops the entries last struck `memory` or longer before `now`.
    pub fn forget_older_than(&mut self, now: Instant, memory: Duration) {
        for map in [&mut self.restarts, &mut self.failures] {
            map.retain(|_, (_, at)| now.saturating_duration_since(*at) < memory);
        }
    }

    /// Triggers with an entry (tests and diagnostics).
    pub fn len(&self) -> usize {
        let mut keys: Vec<&String> = self.restarts.keys().chain(self.failures.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.restarts.is_empty() && self.failures.is_empty()
    }
}

fn strike(map: &mut HashMap<String, (u32, Instant)>, trigger: &str, now: Instant) -> u32 {
    let e = map.entry(trigger.to_string()).or_insert((0, now));
    *e = (e.0 + 1, now);
    e.0
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Report, RoundGate, Strikes};
    use crate::engine::Outcome;
    use crate::store::admission::Refusal;

    /// An `Unexplained` refusal strikes (the back-off grows) instead of clearing the count.
    #[test]
    fn unexplained_refusals_in_a_row_count_up() {
        let (mut s, t0) = (Strikes::default(), Instant::now());
        for n in 1..=3 {
            s.reported(
                "t",
                &Report::Done(Outcome::Refused(Refusal::Unexplained)),
                t0,
            );
            assert_eq!(s.failures("t"), n);
        }
        s.reported("t", &Report::Done(Outcome::Advanced), t0);
        assert_eq!(s.failures("t"), 0, "a definite outcome clears it");
        assert!(s.is_empty());
    }

    /// A trigger that stops reporting here (deleted, or another replica took it over) is
    /// forgotten once its memory has passed; one struck again meanwhile is kept.
    #[test]
    fn strikes_of_triggers_no_longer_seen_are_forgotten() {
        let (mut s, t0) = (Strikes::default(), Instant::now());
        let memory = Duration::from_secs(100);
        s.reported(
            "gone",
            &Report::Done(Outcome::Refused(Refusal::Unexplained)),
            t0,
        );
        s.crashed("gone-too", t0);
        s.crashed("kept", t0);
        s.crashed("kept", t0 + Duration::from_secs(60));
        s.forget_older_than(t0 + Duration::from_secs(99), memory);
        assert_eq!(s.len(), 3);
        s.forget_older_than(t0 + Duration::from_secs(100), memory);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s.crashed("kept", t0 + Duration::from_secs(100)), 3);
    }

    /// A lost fence: the row is someone else's now, its counts go.
    #[test]
    fn a_lost_fence_forgets_the_row() {
        let (mut s, t0) = (Strikes::default(), Instant::now());
        s.reported(
            "t",
            &Report::Done(Outcome::Refused(Refusal::Unexplained)),
            t0,
        );
        s.crashed("t", t0);
        s.reported("t", &Report::Done(Outcome::Refused(Refusal::FenceLost)), t0);
        assert!(s.is_empty(), "{s:?}");
    }

    /// The interleaving that lost the catch-up signal: the timer starts a round while a claim
    /// actor still admits; the actor reports "due again" while that round runs; the round
    /// ends without filling its budget. The signal must survive the round's end.
    #[test]
    fn a_catch_up_signal_raised_during_a_timer_round_survives_its_end() {
        let mut gate = RoundGate::default();
        gate.started(); // the timer's round, while a claim actor is still admitting
        gate.due_again(); // the actor: its next occurrence is already due
        gate.round_done(false); // the round leased less than its budget
        assert!(gate.start_at_once(0), "catch-up lost: {gate:?}");
        gate.started();
        assert!(
            !gate.start_at_once(0),
            "starting a round consumes the signal"
        );
    }

    #[test]
    fn a_filled_round_starts_the_next_at_once_only_when_its_actors_are_done() {
        let mut gate = RoundGate::default();
        gate.started();
        gate.round_done(true);
        assert!(!gate.start_at_once(3));
        assert!(gate.start_at_once(0));
    }

    #[test]
    fn rounds_never_overlap() {
        let mut gate = RoundGate::default();
        gate.started();
        gate.due_again();
        assert!(!gate.idle());
        assert!(!gate.start_at_once(0));
    }
}
