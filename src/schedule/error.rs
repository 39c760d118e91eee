//! Why an expression, a time zone or a misfire policy was rejected.

/// A definition that cannot be evaluated. Each message names the part at fault and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Nothing but whitespace.
    #[error("empty cron expression: expected 5 fields (minute hour day-of-month month day-of-week), 6 or 7 fields (seconds first), or a macro such as @daily")]
    Empty,

    /// Not 5, 6 or 7 whitespace-separated fields.
    #[error("cron expression `{expr}` has {found} fields: expected 5 (minute hour day-of-month month day-of-week), or 6 or 7 with seconds first (second minute hour day-of-month month day-of-week [year]), or a macro (@hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually)")]
    FieldCount {
        /// The expression as written.
        expr: String,
        /// How many fields it has.
        found: usize,
    },

    /// An `@` word other than the accepted macros.
    #[error("unknown cron macro `{0}`: expected one of @hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually")]
    UnknownMacro(String),

    /// One field is wrong: `position` is 1-based within the expression as written.
    #[error("cron field {position} ({name}) `{token}`: {reason}")]
    Field {
        /// 1-based position of the field in the expression.
        position: usize,
        /// The field's name, e.g. `day-of-week`.
        name: &'static str,
        /// The offending value, item or field text.
        token: String,
        /// Why it is refused.
        reason: String,
    },

    /// The `cron` crate refused a form our own checks let through.
    #[error("cron expression `{expr}`: {message}")]
    Cron {
        /// The expression as written.
        expr: String,
        /// What the `cron` crate could not read.
        message: String,
    },

    /// A zone name the tz database (chrono-tz) does not know; names are case-sensitive.
    #[error("unknown IANA time zone `{0}`")]
    UnknownTimeZone(String),

    /// No calendar date matches, so the trigger could never fire.
    #[error("expression never fires (e.g. day 30 of February): `{0}` matches no date")]
    NeverFires(String),

    /// A misfire policy other than `skip` or `fire_once`.
    #[error("unknown misfire policy `{0}`: expected `skip` or `fire_once`")]
    UnknownMisfirePolicy(String),
}
