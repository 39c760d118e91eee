//! The module picture holds: no module of `src` names a module of a higher layer. The layer
//! order and the parsing are the ones `cargo run --example layers` prints.

#[path = "../../examples/layers/scan.rs"]
#[allow(dead_code)]
mod scan;

use std::path::Path;

#[test]
fn no_module_imports_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let arrows = scan::arrows(&src);
    assert!(
        !arrows.is_empty(),
        "no references found under {}",
        src.display()
    );
    let wrong: Vec<String> = arrows
        .iter()
        .filter(|a| a.upward() != Some(false))
        .map(|a| {
            let file = a
                .file
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .unwrap_or(&a.file);
            let why = match a.upward() {
                Some(_) => "upward",
                None => "a module missing from scan::LAYERS",
            };
            format!(
                "{}:{}: {} -> {} ({why})",
                file.display(),
                a.line,
                a.from,
                a.to
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "arrows against the layer order:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let missing: Vec<String> = scan::modules(&src)
        .into_iter()
        .filter(|m| scan::rank(m).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "top-level modules without a layer in scan::LAYERS: {missing:?}"
    );
}
