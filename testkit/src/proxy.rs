//! A loopback TCP fault proxy between one replica and PostgreSQL. It parses just enough of
//! the wire protocol (frontend: type byte + 4-byte length, after an untyped startup packet;
//! backend: the same) to find the **admission**: the extended-protocol statement whose
//! Parse text contains a marker (`INSERT INTO qlsched.runs`), its Bind and its Execute.
//!
//! Faults are armed for every n-th admission, a bounded number of times:
//! - [`Fault::LoseCommitReply`]: the admission and whatever commits it reach the server; as
//!   soon as the server reports the transaction over (ReadyForQuery with status `I` at or
//!   after the admission's sync point) both directions are cut with a reset, before the
//!   client reads that reply. The server committed; the client sees a reset.
//! - [`Fault::LoseCommit`]: the admission's Execute reaches the server (the proxy adds a
//!   Flush to see it executed); nothing the client sends after it does (neither its Sync
//!   nor a COMMIT), and both directions are cut: the server rolls back.
//! - [`Fault::Partition`]: just before the admission's Bind reaches the server, every
//!   connection of this proxy, open or new, stops moving bytes in both directions (a
//!   blackhole, no reset) until [`Proxy::heal`]; then the held bytes flow on, so the
//!   stale admission executes late, after its lease.
//!
//! Whether each admission ran inside an explicit transaction block is read from the
//! server: the ReadyForQuery before the admission's sync point says `T` (in a block) or
//! `I` (idle: the statement runs in its own implicit transaction).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// Text that identifies the admission statement in a Parse message.
const ADMISSION_MARKER: &str = "INSERT INTO qlsched.runs";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    LoseCommitReply,
    LoseCommit,
    Partition,
}

/// One injected fault and the server's replies to the admission the client never saw.
#[derive(Clone, Debug)]
pub struct FaultRecord {
    pub fault: Fault,
    /// CommandComplete tags (`SELECT 1`, `COMMIT`) and error SQLSTATEs (`E:23505`).
    pub replies: Vec<String>,
    /// The server reported the transaction over with no error (LoseCommitReply only).
    pub committed: bool,
    /// The admission's result rows, read as (text, int8) pairs: for qlsched's admission
    /// statement (trigger id, queued_at_ms) of every run it wrote.
    pub rows: Vec<(String, i64)>,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub connections: u32,
    /// Admission Executes forwarded to the server.
    pub admissions: u32,
    /// Of those, how many ran inside an explicit transaction block, and how many outside.
    pub in_transaction_block: u32,
    pub outside_transaction_block: u32,
    pub faults: Vec<FaultRecord>,
    /// Replies to the admission held by a partition and delivered after the heal.
    pub after_heal: Vec<String>,
}

struct Plan {
    fault: Option<Fault>,
    every: u32,
    remaining: u32,
    seen: u32,
}

struct Shared {
    upstream: SocketAddr,
    /// Text that identifies the statement faults apply to (the run insert by default).
    marker: &'static str,
    plan: Mutex<Plan>,
    paused: watch::Sender<bool>,
    stats: Mutex<Stats>,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Shared {
    /// Counts one candidate for `kind`; true if the armed plan fires on it.
    fn fires(&self, kind: Fault) -> bool {
        let mut p = self.plan.lock().unwrap();
        if p.fault != Some(kind) || p.remaining == 0 {
            return false;
        }
        p.seen += 1;
        if p.seen % p.every.max(1) == 0 {
            p.remaining -= 1;
            return true;
        }
        false
    }
}

pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream_port`.
    pub async fn start(upstream_port: u16) -> Proxy {
        Proxy::start_with_marker(upstream_port, ADMISSION_MARKER).await
    }

    /// Like [`Proxy::start`], with faults applied to the statement whose Parse text
    /// contains `marker` instead of the admission (e.g. the claim statement).
    pub async fn start_with_marker(upstream_port: u16, marker: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream: format!("127.0.0.1:{upstream_port}").parse().unwrap(),
            marker,
            plan: Mutex::new(Plan {
                fault: None,
                every: 1,
                remaining: 0,
                seen: 0,
            }),
            paused: watch::channel(false).0,
            stats: Mutex::new(Stats::default()),
            tasks: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                s.stats.lock().unwrap().connections += 1;
                let conn = tokio::spawn(serve(s.clone(), client));
                s.tasks.lock().unwrap().push(conn.abort_handle());
            }
        });
        shared.tasks.lock().unwrap().push(accept.abort_handle());
        Proxy { port, shared }
    }

    /// Applies `fault` to every `every`-th admission from now on, `times` times in all.
    pub fn arm(&self, fault: Fault, every: u32, times: u32) {
        *self.shared.plan.lock().unwrap() = Plan {
            fault: Some(fault),
            every,
            remaining: times,
            seen: 0,
        };
    }

    /// Faults still to inject.
    pub fn remaining(&self) -> u32 {
        self.shared.plan.lock().unwrap().remaining
    }

    pub fn partitioned(&self) -> bool {
        *self.shared.paused.borrow()
    }

    /// Ends a partition: held bytes flow on, in order.
    pub fn heal(&self) {
        self.shared.paused.send_replace(false);
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().unwrap().clone()
    }

    /// A libpq DSN through the proxy.
    pub fn dsn(&self, user: &str, db: &str) -> String {
        format!("host=127.0.0.1 port={} user={user} dbname={db}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for t in self.shared.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

/// What the connection does with the server's replies after an admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// Hold replies from sync point `from` on; cut at the first ReadyForQuery `I`.
    UntilCommitted { from: u64 },
    /// Hold replies from sync point `from` on; cut once the Execute completed.
    UntilExecuted { from: u64 },
}

#[derive(Default)]
struct Conn {
    startup: bool,
    ssl_replies: u32,
    /// Sync points (Query, Sync) the client sent.
    client_syncs: u64,
    /// ReadyForQuery messages seen from the server (the one ending startup is number 0).
    server_rfq: i64,
    /// Statement names whose Parse carried the marker; whether the last Bind used one.
    admission_stmts: HashSet<Vec<u8>>,
    bound_admission: bool,
    /// ReadyForQuery status by number, and admissions waiting to learn theirs.
    rfq_status: HashMap<i64, u8>,
    waiting_context: Vec<i64>,
    /// Client messages not yet forwarded (`true` = a startup packet, untyped).
    c2s: VecDeque<(bool, Vec<u8>)>,
    s2c: VecDeque<Vec<u8>>,
    client_blocked: bool,
    hold: Option<Hold>,
    held: Vec<Vec<u8>>,
    record: Option<FaultRecord>,
    /// The admission that triggered a partition was decided already (do not re-trigger).
    partition_decided: bool,
    stale_sync: Option<u64>,
    cut: bool,
}

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;

fn cstr(b: &[u8]) -> (&[u8], &[u8]) {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    (&b[..end], b.get(end + 1..).unwrap_or(&[]))
}

/// One complete frontend message off `buf`, if there is one.
fn take_frontend(buf: &mut Vec<u8>, c: &mut Conn) -> Option<Vec<u8>> {
    if c.startup {
        if buf.len() < 8 {
            return None;
        }
        let len = u32::from_be_bytes(buf[0..4].try_into().unwrap()) as usize;
        if buf.len() < len {
            return None;
        }
        let code = u32::from_be_bytes(buf[4..8].try_into().unwrap());
        if code == SSL_REQUEST || code == GSSENC_REQUEST {
            c.ssl_replies += 1;
        } else {
            c.startup = false;
        }
        return Some(buf.drain(..len).collect());
    }
    take_typed(buf)
}

fn take_backend(buf: &mut Vec<u8>, c: &mut Conn) -> Option<Vec<u8>> {
    if c.ssl_replies > 0 {
        if buf.is_empty() {
            return None;
        }
        c.ssl_replies -= 1;
        return Some(buf.drain(..1).collect());
    }
    take_typed(buf)
}

fn take_typed(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    if buf.len() < 5 {
        return None;
    }
    let len = 1 + u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
    if buf.len() < len {
        return None;
    }
    Some(buf.drain(..len).collect())
}

/// A CommandComplete tag or an error's SQLSTATE, for the records.
fn reply_label(m: &[u8]) -> Option<String> {
    match m[0] {
        b'C' => Some(String::from_utf8_lossy(cstr(&m[5..]).0).into_owned()),
        b'E' => {
            let mut rest = &m[5..];
            while let Some((&field, tail)) = rest.split_first() {
                if field == 0 {
                    break;
                }
                let (value, tail) = cstr(tail);
                if field == b'C' {
                    return Some(format!("E:{}", String::from_utf8_lossy(value)));
                }
                rest = tail;
            }
            Some("E:?".into())
        }
        _ => None,
    }
}

/// A DataRow whose first two columns are a text and an int8 (binary format).
fn text_int8_row(m: &[u8]) -> Option<(String, i64)> {
    if m[0] != b'D' || m.len() < 7 {
        return None;
    }
    let ncols = i16::from_be_bytes([m[5], m[6]]);
    if ncols < 2 {
        return None;
    }
    let mut at = 7;
    let mut col = || -> Option<&[u8]> {
        let len = i32::from_be_bytes(m.get(at..at + 4)?.try_into().ok()?);
        at += 4;
        let len = usize::try_from(len).ok()?;
        let v = m.get(at..at + len)?;
        at += len;
        Some(v)
    };
    let text = String::from_utf8(col()?.to_vec()).ok()?;
    let int = i64::from_be_bytes(col()?.try_into().ok()?);
    Some((text, int))
}

enum Step {
    Forward,
    /// Forward, then send these bytes too.
    ForwardThen(Vec<u8>),
    /// Leave it queued: the proxy is (now) partitioned.
    Wait,
}

/// Classifies one client message (and arms holds); `c.client_syncs` is updated for it.
fn on_client(shared: &Shared, c: &mut Conn, m: &[u8], startup: bool) -> Step {
    if startup {
        return Step::Forward;
    }
    let body = &m[5..];
    match m[0] {
        b'Q' | b'S' => c.client_syncs += 1,
        b'P' => {
            let (name, rest) = cstr(body);
            let (query, _) = cstr(rest);
            let is_admission = String::from_utf8_lossy(query).contains(shared.marker);
            if is_admission {
                c.admission_stmts.insert(name.to_vec());
            } else {
                c.admission_stmts.remove(name);
            }
        }
        b'B' => {
            let (_portal, rest) = cstr(body);
            let (stmt, _) = cstr(rest);
            c.bound_admission = c.admission_stmts.contains(stmt);
            if c.bound_admission && !c.partition_decided && shared.fires(Fault::Partition) {
                c.partition_decided = true;
                c.stale_sync = Some(c.client_syncs + 1);
                shared.paused.send_replace(true);
                return Step::Wait;
            }
            c.partition_decided = false;
        }
        b'E' if c.bound_admission => {
            let sync = c.client_syncs + 1;
            shared.stats.lock().unwrap().admissions += 1;
            let before = sync as i64 - 1;
            match c.rfq_status.get(&before) {
                Some(&status) => count_context(shared, status),
                None => c.waiting_context.push(before),
            }
            if shared.fires(Fault::LoseCommitReply) {
                c.hold = Some(Hold::UntilCommitted { from: sync });
                c.record = Some(FaultRecord {
                    fault: Fault::LoseCommitReply,
                    replies: Vec::new(),
                    committed: false,
                    rows: Vec::new(),
                });
            } else if shared.fires(Fault::LoseCommit) {
                c.hold = Some(Hold::UntilExecuted { from: sync });
                c.record = Some(FaultRecord {
                    fault: Fault::LoseCommit,
                    replies: Vec::new(),
                    committed: false,
                    rows: Vec::new(),
                });
                c.client_blocked = true;
                // Flush: make the server send the Execute's result without a Sync.
                return Step::ForwardThen(vec![b'H', 0, 0, 0, 4]);
            }
        }
        _ => {}
    }
    Step::Forward
}

fn count_context(shared: &Shared, status: u8) {
    let mut s = shared.stats.lock().unwrap();
    if status == b'I' {
        s.outside_transaction_block += 1;
    } else {
        s.in_transaction_block += 1;
    }
}

/// Handles one server message: true = forward it to the client now.
fn on_server(shared: &Shared, c: &mut Conn, m: &[u8]) -> bool {
    if m.len() < 5 {
        return true; // an SSL negotiation byte
    }
    let index = c.server_rfq + 1;
    if Some(index as u64) == c.stale_sync {
        if let Some(label) = reply_label(m) {
            shared.stats.lock().unwrap().after_heal.push(label);
        }
    }
    if m[0] == b'Z' {
        c.server_rfq += 1;
        let status = m[5];
        c.rfq_status.insert(c.server_rfq, status);
        if let Some(i) = c.waiting_context.iter().position(|&n| n == c.server_rfq) {
            c.waiting_context.remove(i);
            count_context(shared, status);
        }
        if Some(c.server_rfq as u64) == c.stale_sync {
            c.stale_sync = None;
        }
    }
    let Some(hold) = c.hold else { return true };
    let (Hold::UntilCommitted { from } | Hold::UntilExecuted { from }) = hold;
    let from = from as i64;
    if index < from {
        return true;
    }
    if let Some(rec) = c.record.as_mut() {
        rec.replies.extend(reply_label(m));
        rec.rows.extend(text_int8_row(m));
    }
    match (hold, m[0]) {
        (Hold::UntilCommitted { .. }, b'Z') if m[5] == b'I' => {
            let mut rec = c.record.take().unwrap();
            rec.committed = !rec.replies.iter().any(|r| r.starts_with("E:"));
            shared.stats.lock().unwrap().faults.push(rec);
            c.cut = true;
        }
        (Hold::UntilCommitted { .. }, b'Z') => {
            c.held.push(m.to_vec());
            // Still inside the transaction: what was held so far may go to the client.
            c.s2c.extend(c.held.drain(..));
            return false;
        }
        (Hold::UntilExecuted { .. }, b'C' | b'E') => {
            shared
                .stats
                .lock()
                .unwrap()
                .faults
                .push(c.record.take().unwrap());
            c.cut = true;
        }
        _ => c.held.push(m.to_vec()),
    }
    false
}

async fn serve(shared: Arc<Shared>, client: TcpStream) {
    let Ok(server) = TcpStream::connect(shared.upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let _ = pump(&shared, cr, cw, sr, sw).await;
}

async fn pump(
    shared: &Shared,
    mut cr: OwnedReadHalf,
    mut cw: OwnedWriteHalf,
    mut sr: OwnedReadHalf,
    mut sw: OwnedWriteHalf,
) -> std::io::Result<()> {
    let mut paused = shared.paused.subscribe();
    let mut c = Conn {
        startup: true,
        server_rfq: -1,
        ..Conn::default()
    };
    let (mut cbuf, mut sbuf) = (Vec::new(), Vec::new());
    let mut chunk = vec![0u8; 16 * 1024];
    let mut chunk2 = vec![0u8; 16 * 1024];
    loop {
        // Move what is queued, unless partitioned.
        while !*paused.borrow() && !c.client_blocked {
            let Some((startup, m)) = c.c2s.pop_front() else {
                break;
            };
            match on_client(shared, &mut c, &m, startup) {
                Step::Forward => sw.write_all(&m).await?,
                Step::ForwardThen(extra) => {
                    sw.write_all(&m).await?;
                    sw.write_all(&extra).await?;
                }
                Step::Wait => c.c2s.push_front((startup, m)),
            }
        }
        while !*paused.borrow() {
            let Some(m) = c.s2c.pop_front() else { break };
            cw.write_all(&m).await?;
        }
        if c.cut {
            // A reset, not a clean close, on both sides (a zero linger never blocks).
            #[allow(deprecated)]
            {
                let _ = cr.as_ref().set_linger(Some(Duration::ZERO));
                let _ = sr.as_ref().set_linger(Some(Duration::ZERO));
            }
            return Ok(());
        }
        let open = !*paused.borrow();
        tokio::select! {
            n = cr.read(&mut chunk), if open && !c.client_blocked => {
                let n = n?;
                if n == 0 {
                    return Ok(());
                }
                cbuf.extend_from_slice(&chunk[..n]);
                loop {
                    let startup = c.startup;
                    let Some(m) = take_frontend(&mut cbuf, &mut c) else { break };
                    c.c2s.push_back((startup, m));
                }
            }
            n = sr.read(&mut chunk2), if open => {
                let n = n?;
                if n == 0 {
                    return Ok(());
                }
                sbuf.extend_from_slice(&chunk2[..n]);
                while let Some(m) = take_backend(&mut sbuf, &mut c) {
                    if on_server(shared, &mut c, &m) {
                        c.s2c.push_back(m);
                    }
                    if c.cut {
                        break;
                    }
                }
            }
            _ = paused.changed() => {}
        }
    }
}
