//! Prints the module picture: each top-level module of `src` in layer order, the modules it
//! names, and every arrow that runs upward (a lower layer naming a higher one), with the
//! first file and line that draws it. `cargo run --example layers [-- SRC_DIR]`.
//!
//! The same parsing and layer order back the integration test `layers`.

#[path = "layers/scan.rs"]
mod scan;

use std::path::PathBuf;

fn main() {
    let src = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src"));
    let arrows = scan::arrows(&src);
    let picture = scan::picture(&arrows);
    let mut modules = scan::modules(&src);
    modules.sort_by_key(|m| (scan::rank(m).unwrap_or(usize::MAX), m.clone()));
    let mut upward = Vec::new();
    for m in &modules {
        let layer = scan::rank(m).map_or("?".to_owned(), |r| r.to_string());
        let targets = picture.get(m);
        let names: Vec<String> = targets
            .map(|t| {
                let mut v: Vec<&scan::Arrow> = t.values().collect();
                v.sort_by_key(|a| (scan::rank(&a.to).unwrap_or(usize::MAX), a.to.clone()));
                v.iter()
                    .map(|a| match a.upward() {
                        Some(false) => a.to.clone(),
                        Some(true) => format!("{}(UP)", a.to),
                        None => format!("{}(?)", a.to),
                    })
                    .collect()
            })
            .unwrap_or_default();
        println!("[{layer:>2}] {m:<10} -> {}", names.join(", "));
        if let Some(t) = targets {
            upward.extend(t.values().filter(|a| a.upward() != Some(false)));
        }
    }
    println!();
    if upward.is_empty() {
        println!("no upward arrows");
    }
    for a in upward {
        let file = a.file.strip_prefix(&src).unwrap_or(&a.file);
        let how = if a.upward().is_some() {
            "upward"
        } else {
            "unranked"
        };
        println!(
            "{how}: {} -> {}  (src/{}:{})",
            a.from,
            a.to,
            file.display(),
            a.line
        );
    }
}
