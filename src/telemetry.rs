//! The root slog logger: JSON for services, terminal format for humans; async and fused.
//! `log` records from tokio-postgres and bb8 are routed into it.

use slog::{o, Drain, Level};

use crate::config::LogFormat;

/// Keeps the async drain and the `log` bridge alive; drop it last so the final lines (often
/// the reason for the exit) are flushed. Dropping the loggers is not enough: clones of the
/// root outlive `run` (actors, the global scope), so the async drain would never be dropped
/// and whatever its thread had not written yet was lost at exit. Its guard stops that thread
/// after it has written every queued record (fields drop in order: the scope, then the drain).
pub struct LogGuard {
    _scope: slog_scope::GlobalLoggerGuard,
    _drain: slog_async::AsyncGuard,
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
    let (drain, flush): (slog_async::Async, slog_async::AsyncGuard) = match format {
        LogFormat::Json => {
            let json = slog_json::Json::new(std::io::stdout())
                .add_default_keys()
                .build()
                .fuse();
            slog_async::Async::new(json)
                .chan_size(4096)
                .build_with_guard()
        }
        LogFormat::Text => {
            let decorator = slog_term::TermDecorator::new().stderr().build();
            let term = slog_term::FullFormat::new(decorator).build().fuse();
            slog_async::Async::new(term)
                .chan_size(4096)
                .build_with_guard()
        }
    };
    // After the guard has stopped the drain's thread a late record (a lingering connection
    // task) is dropped, not a panic.
    let drain = drain.ignore_res();
    let drain = slog::LevelFilter::new(drain, level).fuse();
    let root = match replica {
        Some(r) => slog::Logger::root(drain, o!("replica" => r.to_string())),
        None => slog::Logger::root(drain, o!()),
    };
    let scope = slog_scope::set_global_logger(root.clone());
    // tokio-postgres / bb8 speak `log`; keep their chatter at warning and above.
    let _ = slog_stdlog::init_with_level(log::Level::Warn);
    (
        root,
        LogGuard {
            _scope: scope,
            _drain: flush,
        },
    )
}
