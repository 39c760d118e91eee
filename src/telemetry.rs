//! The root slog logger: JSON for services, terminal format for humans; async and fused.
//! `log` records from tokio-postgres and bb8 are routed into it.

use slog::{o, Drain, Level};

use crate::config::LogFormat;

/// Keeps the async drain and the `log` bridge alive; drop it last so the final lines (often
/// the reason for the exit) are flushed.
pub struct LogGuard {
    _scope: slog_scope::GlobalLoggerGuard,
}

pub fn level_from(name: &str) -> Level {
    match name {
        "trace" => Level::Trace,
        "debug" => Level::Debug,
        "warning" | "warn" => Level::Warning,
        "error" => Level::Error,
        "critical" => Level::Critical,
        _ => Level::Info,
    }
}

pub fn init(format: LogFormat, level: &str, replica: Option<&str>) -> (slog::Logger, LogGuard) {
    let level = level_from(level);
    // slog_async::Async is one concrete type whatever it wraps.
    let drain: slog_async::Async = match format {
        LogFormat::Json => {
            let json = slog_json::Json::new(std::io::stdout())
                .add_default_keys()
                .build()
                .fuse();
            slog_async::Async::new(json).chan_size(4096).build()
        }
        LogFormat::Text => {
            let decorator = slog_term::TermDecorator::new().stderr().build();
            let term = slog_term::FullFormat::new(decorator).build().fuse();
            slog_async::Async::new(term).chan_size(4096).build()
        }
    };
    let drain = drain.fuse();
    let drain = slog::LevelFilter::new(drain, level).fuse();
    let root = match replica {
        Some(r) => slog::Logger::root(drain, o!("replica" => r.to_string())),
        None => slog::Logger::root(drain, o!()),
    };
    let scope = slog_scope::set_global_logger(root.clone());
    // tokio-postgres / bb8 speak `log`; keep their chatter at warning and above.
    let _ = slog_stdlog::init_with_level(log::Level::Warn);
    (root, LogGuard { _scope: scope })
}
