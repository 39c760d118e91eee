//! Prints the claim statement with its limit as a parameter (`CLAIM_DUE_SQL`, with its
//! parameters `$1` owner, `$2` lease ms, `$3` limit, `$4` round id, `$5` guard incarnation,
//! `$6` guard TTL ms), for the benchmark's pgbench scripts and EXPLAIN runs. It is the same
//! statement text as each of `CLAIM_VARIANTS`, which the daemon prepares with the limit
//! written in (one text per power of two).
fn main() {
    print!("{}", qlsched::store::claim::CLAIM_DUE_SQL);
}
