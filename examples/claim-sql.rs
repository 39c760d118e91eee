//! Prints the claim statement exactly as the daemon sends it (`CLAIM_DUE_SQL`, with its
//! parameters `$1` owner, `$2` lease ms, `$3` limit, `$4` round id, `$5` guard incarnation,
//! `$6` guard TTL ms), for the benchmark's pgbench scripts and EXPLAIN runs.
fn main() {
    print!("{}", qlsched::store::claim::CLAIM_DUE_SQL);
}
