//! Connecting the way libpq does (docs/design.md, "Connecting"). A DSN may list several
//! hosts — names, Unix socket directories, with `hostaddr`s and ports — and each is tried in
//! turn, each within the DSN's own `connect_timeout`, until one accepts and has the session
//! attributes asked for (`target_session_attrs`). So a dead first host costs at most one
//! `connect_timeout`, and a whole attempt at most one per host and pass.
//!
//! - A Unix socket never speaks TLS, under every `sslmode` (libpq ignores it there; the
//!   server refuses TLS on sockets).
//! - `hostaddr` is where the TCP connection goes; `host`, when given too, is the name the
//!   server certificate is verified against. A `hostaddr` alone is verified as an address.
//! - The host that accepted last is tried first next time, so after a fail-over every new
//!   connection goes straight to the new primary instead of through a dead one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio_postgres::config::{
    Host, LoadBalanceHosts, SslMode as DriverSslMode, TargetSessionAttrs,
};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, Socket};

use super::Tls;

/// The stream a connection runs on (TCP or Unix socket, with or without TLS).
pub type Stream = <Tls as MakeTlsConnect<Socket>>::Stream;

/// libpq's `target_session_attrs`. The driver checks `transaction_read_only` after
/// connecting: `primary` is judged as `read-write` and `standby` as `read-only` (a primary
/// whose `default_transaction_read_only` is on counts as a standby here, unlike libpq,
/// which asks `pg_is_in_recovery()`); `prefer-standby` tries every host for a read-only
/// session first, then every host for any session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SessionAttrs {
    #[default]
    Any,
    ReadWrite,
    ReadOnly,
    Primary,
    Standby,
    PreferStandby,
}

impl SessionAttrs {
    pub fn parse(s: &str) -> Option<SessionAttrs> {
        Some(match s {
            "any" => SessionAttrs::Any,
            "read-write" => SessionAttrs::ReadWrite,
            "read-only" => SessionAttrs::ReadOnly,
            "primary" => SessionAttrs::Primary,
            "standby" => SessionAttrs::Standby,
            "prefer-standby" => SessionAttrs::PreferStandby,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::ReadOnly => "read-only",
            SessionAttrs::Primary => "primary",
            SessionAttrs::Standby => "standby",
            SessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// How many times each host may be tried in one attempt.
    pub fn pass_count(self) -> usize {
        self.passes().len()
    }

    /// The passes over the host list, each with the check the driver makes per host.
    fn passes(self) -> &'static [TargetSessionAttrs] {
        match self {
            SessionAttrs::Any => &[TargetSessionAttrs::Any],
            SessionAttrs::ReadWrite | SessionAttrs::Primary => &[TargetSessionAttrs::ReadWrite],
            SessionAttrs::ReadOnly | SessionAttrs::Standby => &[TargetSessionAttrs::ReadOnly],
            SessionAttrs::PreferStandby => &[TargetSessionAttrs::ReadOnly, TargetSessionAttrs::Any],
        }
    }
}

/// Which host of a target answered last; shared by every clone of the target (the pool,
/// the claim and admission sessions, the listener), so all of them follow a fail-over.
#[derive(Clone, Debug, Default)]
pub struct LastGood(Arc<AtomicUsize>);

/// The number of hosts a driver config lists (hosts and hostaddrs pair up by position).
pub fn host_count(pg: &Config) -> usize {
    pg.get_hosts().len().max(pg.get_hostaddrs().len())
}

/// Connects to the first host, starting with the last good one, that accepts within its
/// `connect_timeout` and has the wanted session attributes. The error is the last host's.
pub async fn connect(
    pg: &Config,
    tls: &Tls,
    attrs: SessionAttrs,
    last_good: &LastGood,
) -> Result<(Client, Connection<Socket, Stream>), tokio_postgres::Error> {
    first_that_connects(pg, attrs, last_good, |one| {
        let tls = tls.clone();
        async move { one.connect(tls).await }
    })
    .await
}

/// Tries `connect` with the config of each host in turn (the last good one first, every
/// host once per pass of `attrs`) and returns the first success, or the last error.
pub async fn first_that_connects<T, F, Fut>(
    pg: &Config,
    attrs: SessionAttrs,
    last_good: &LastGood,
    mut connect: F,
) -> Result<T, tokio_postgres::Error>
where
    F: FnMut(Config) -> Fut,
    Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
{
    let n = host_count(pg).max(1);
    let first = last_good.0.load(Ordering::Relaxed) % n;
    let mut last_error = None;
    for &want in attrs.passes() {
        for k in 0..n {
            let i = (first + k) % n;
            let attempt = connect(one_host(pg, i, want));
            // As libpq's, the time-out covers the whole of one host's attempt (TCP, TLS,
            // authentication, the session check), not only the TCP connect the driver
            // bounds: a host that accepts and never answers costs one time-out too.
            let outcome = match pg.get_connect_timeout() {
                Some(bound) => tokio::time::timeout(*bound, attempt)
                    .await
                    .unwrap_or_else(|_| Err(tokio_postgres::Error::__private_api_timeout())),
                None => attempt.await,
            };
            match outcome {
                Ok(connected) => {
                    last_good.0.store(i, Ordering::Relaxed);
                    return Ok(connected);
                }
                Err(e) => last_error = Some(e),
            }
        }
    }
    Err(last_error.expect("at least one host is tried"))
}

/// The driver config for host `i` alone, with everything else of `pg`.
pub fn one_host(pg: &Config, i: usize, want: TargetSessionAttrs) -> Config {
    let mut c = Config::new();
    if let Some(v) = pg.get_user() {
        c.user(v);
    }
    if let Some(v) = pg.get_password() {
        c.password(v);
    }
    if let Some(v) = pg.get_dbname() {
        c.dbname(v);
    }
    if let Some(v) = pg.get_options() {
        c.options(v);
    }
    if let Some(v) = pg.get_application_name() {
        c.application_name(v);
    }
    if let Some(v) = pg.get_connect_timeout() {
        c.connect_timeout(*v);
    }
    if let Some(v) = pg.get_tcp_user_timeout() {
        c.tcp_user_timeout(*v);
    }
    c.keepalives(pg.get_keepalives())
        .keepalives_idle(pg.get_keepalives_idle());
    if let Some(v) = pg.get_keepalives_interval() {
        c.keepalives_interval(v);
    }
    if let Some(v) = pg.get_keepalives_retries() {
        c.keepalives_retries(v);
    }
    c.channel_binding(pg.get_channel_binding())
        .ssl_negotiation(pg.get_ssl_negotiation())
        .ssl_mode(pg.get_ssl_mode())
        .load_balance_hosts(LoadBalanceHosts::Disable)
        .target_session_attrs(want);
    let port = pg
        .get_ports()
        .get(i)
        .or_else(|| pg.get_ports().first())
        .copied()
        .unwrap_or(5432);
    c.port(port);
    match (pg.get_hosts().get(i), pg.get_hostaddrs().get(i)) {
        #[cfg(unix)]
        (Some(Host::Unix(dir)), _) => {
            c.host_path(dir).ssl_mode(DriverSslMode::Disable);
        }
        (Some(Host::Tcp(name)), addr) => {
            c.host(name);
            if let Some(a) = addr {
                c.hostaddr(*a);
            }
        }
        // An address alone: it is also the name the certificate must carry (an IP SAN).
        (None, Some(a)) => {
            c.host(a.to_string());
        }
        (None, None) => {}
    }
    c
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn each_host_gets_its_own_port_address_and_the_rest_of_the_settings() {
        let pg = Config::from_str(
            "host=db1,/run/pg,db3 hostaddr=10.0.0.1,10.0.0.2,10.0.0.3 port=5432,5433,5434 \
             user=u dbname=d connect_timeout=3 application_name=a sslmode=require",
        )
        .unwrap();
        let c = one_host(&pg, 0, TargetSessionAttrs::ReadWrite);
        assert_eq!(c.get_hosts(), &[Host::Tcp("db1".into())]);
        assert_eq!(
            c.get_hostaddrs(),
            &["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(c.get_ports(), &[5432]);
        assert_eq!(c.get_user(), Some("u"));
        assert_eq!(c.get_dbname(), Some("d"));
        assert_eq!(c.get_application_name(), Some("a"));
        assert_eq!(
            c.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3))
        );
        assert_eq!(c.get_ssl_mode(), DriverSslMode::Require);
        assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
        // A socket directory: no TLS under any sslmode, as libpq.
        let c = one_host(&pg, 1, TargetSessionAttrs::Any);
        assert_eq!(c.get_hosts(), &[Host::Unix("/run/pg".into())]);
        assert_eq!(c.get_ports(), &[5433]);
        assert_eq!(c.get_ssl_mode(), DriverSslMode::Disable);
        // hostaddr alone: the address is the host (and the name TLS verifies).
        let pg = Config::from_str("hostaddr=127.0.0.1 port=6000").unwrap();
        let c = one_host(&pg, 0, TargetSessionAttrs::Any);
        assert_eq!(c.get_hosts(), &[Host::Tcp("127.0.0.1".into())]);
        assert_eq!(c.get_ports(), &[6000]);
    }

    #[test]
    fn every_libpq_session_attribute_parses_and_prefer_standby_makes_two_passes() {
        for s in [
            "any",
            "read-write",
            "read-only",
            "primary",
            "standby",
            "prefer-standby",
        ] {
            assert_eq!(SessionAttrs::parse(s).unwrap().as_str(), s);
        }
        assert!(SessionAttrs::parse("master").is_none());
        assert_eq!(SessionAttrs::PreferStandby.passes().len(), 2);
        assert_eq!(
            SessionAttrs::Primary.passes(),
            &[TargetSessionAttrs::ReadWrite]
        );
    }
}
