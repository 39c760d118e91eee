//! The sizes of every row, per mode: the smoke mode runs each row at toy size and never
//! waits for a minute boundary (its herds fire at a second offset chosen at publish time).

#[derive(Clone, Debug)]
pub struct Sizes {
    pub smoke: bool,
    /// Seconds of each ceiling run, and the due rows it starts with.
    pub ceil_s: f64,
    pub ceil_rows: u64,
    pub drain_ns: Vec<u64>,
    /// Runs of the ceiling and of each drain (the median is reported).
    pub reps: usize,
    pub steady_n: u64,
    pub steady_s: f64,
    pub warm_s: f64,
    /// Seconds between a lag window's end and stopping the replicas (late runs still count).
    pub tail_s: f64,
    pub second_n: u64,
    pub second_s: f64,
    pub claim_ns: Vec<u64>,
    pub claim_live: u64,
    pub claim_tx: u64,
    pub idle_n: u64,
    pub idle_s: f64,
    pub herd_n: u64,
    pub herd_b: usize,
    /// Seconds after the replicas are ready before the first herd boundary.
    pub herd_lead_s: i64,
    /// Seconds from loading the lag rows' triggers to their first occurrence.
    pub lag_lead_ms: i64,
    pub budget: u32,
    pub lease: &'static str,
    /// Drains and ceilings tolerate a 1 h backlog: late occurrences are admitted, not skipped.
    pub drain_grace_ms: i64,
    /// TLS and WAL rows: drain size and repetitions.
    pub pair_n: u64,
    pub pair_reps: usize,
}

impl Sizes {
    pub fn quick() -> Sizes {
        Sizes {
            smoke: false,
            ceil_s: 10.0,
            ceil_rows: 100_000,
            drain_ns: vec![10_000],
            reps: 1,
            steady_n: 10_000,
            steady_s: 70.0,
            warm_s: 5.0,
            tail_s: 3.0,
            second_n: std::env::var("QLSCHED_BENCH_SECOND_N")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(200),
            second_s: 30.0,
            claim_ns: vec![1_000, 100_000],
            claim_live: 10_000,
            claim_tx: 500,
            idle_n: 100_000,
            idle_s: 30.0,
            herd_n: 10_000,
            herd_b: 3,
            herd_lead_s: 10,
            lag_lead_ms: 3000,
            budget: std::env::var("QLSCHED_BENCH_BUDGET")
                .ok()
                .and_then(|b| b.parse().ok())
                .unwrap_or(64),
            lease: "30s",
            drain_grace_ms: 3_600_000,
            pair_n: 10_000,
            pair_reps: 2,
        }
    }

    pub fn full() -> Sizes {
        Sizes {
            ceil_s: 20.0,
            ceil_rows: 150_000,
            drain_ns: vec![10_000, 100_000],
            reps: 3,
            steady_s: 190.0,
            second_s: 60.0,
            claim_ns: vec![1_000, 100_000, 1_000_000],
            claim_tx: 1000,
            herd_b: 6,
            ..Sizes::quick()
        }
    }

    pub fn smoke() -> Sizes {
        Sizes {
            smoke: true,
            ceil_s: 0.5,
            ceil_rows: 3_000,
            drain_ns: vec![300],
            steady_n: 120,
            steady_s: 5.0,
            warm_s: 2.5,
            tail_s: 1.0,
            second_n: 20,
            second_s: 5.0,
            claim_ns: vec![500, 2_000],
            claim_live: 200,
            claim_tx: 30,
            idle_n: 1_000,
            idle_s: 2.0,
            herd_n: 150,
            herd_b: 1,
            herd_lead_s: 1,
            lag_lead_ms: 1000,
            pair_n: 200,
            pair_reps: 1,
            ..Sizes::quick()
        }
    }
}
