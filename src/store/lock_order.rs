//! The statements lock tables in the order migrations must lock them
//! ([`crate::schema::lint::LOCK_ORDER`]): checked against the statements' text.

use regex::Regex;

use crate::schema::lint::LOCK_ORDER;

/// The tables a statement opens, in the order it opens (and locks) them: the parser
/// takes each relation's lock as it meets it (a CTE before the next, an UPDATE's target
/// before its FROM list), i.e. in the order of first mention. A name followed at once by `(`
/// is a function called, not a table (a table's column list follows a space); a function
/// that writes a table ([`FUNCTION_OPENS`]) opens that table where it is called.
fn opened(sql: &str) -> Vec<String> {
    let re = Regex::new(r"qlsched\.([a-z_]+)(\()?").unwrap();
    let mut out: Vec<String> = Vec::new();
    for c in re.captures_iter(sql) {
        let table = if c.get(2).is_some() {
            match FUNCTION_OPENS.iter().find(|(f, _)| *f == &c[1]) {
                Some((_, t)) => *t,
                None => continue,
            }
        } else {
            c.get(1).unwrap().as_str()
        };
        if !out.iter().any(|t| t == table) {
            out.push(table.to_string());
        }
    }
    out
}

/// The owner's functions the statements call that lock rows of a table (V26: the admission's
/// overlap decision reads and writes the overlap rows through them; V28's variant and undo).
const FUNCTION_OPENS: [(&str, &str); 4] = [
    ("overlap_decide", "trigger_overlap"),
    ("overlap_undo", "trigger_overlap"),
    ("overlap_decide_with", "trigger_overlap"),
    ("overlap_release", "trigger_overlap"),
];

#[test]
fn the_lock_order_is_the_order_the_admission_statement_locks_in() {
    let tables = opened(super::admission::ADMIT_SQL);
    let positions: Vec<usize> = tables
        .iter()
        .map(|t| {
            LOCK_ORDER
                .iter()
                .position(|o| o == t)
                .unwrap_or_else(|| panic!("{t} is not in LOCK_ORDER"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "the admission opens {tables:?}, against LOCK_ORDER {LOCK_ORDER:?}"
    );
    assert_eq!(tables.len(), 10, "{tables:?}");
    // The claim opens replicas first, then trigger_schedules and triggers.
    let claim = opened(super::claim::CLAIM_DUE_SQL);
    assert_eq!(
        claim[..3],
        ["replicas", "trigger_schedules", "triggers"],
        "{claim:?}"
    );
}
