//! Writes `docs/settings.md`, the settings reference, from the comments of
//! `config/default.toml` (the one place each setting is documented):
//!
//! ```text
//! cargo run --example settings-doc
//! ```
//!
//! The test `docs_drift::the_settings_page_is_rendered_from_the_current_defaults` fails until
//! the page is written again after a change of those comments.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/settings.md");
    match std::fs::write(&page, qlsched::config::reference::markdown()) {
        Ok(()) => {
            println!("{}", page.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("settings-doc: {}: {e}", page.display());
            ExitCode::FAILURE
        }
    }
}
