//! Plain HTTP/1.0 against a replica's port, headers and all (the console, the transport
//! limits): the raw exchange, so a test sees exactly what the replica sends.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// (status, lower-cased headers, body).
pub type Response = (u16, Vec<(String, String)>, String);

/// One GET of `path` with the `Host` header `host` (none if `None`) and `headers`.
pub fn get(addr: SocketAddr, host: Option<&str>, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {path} HTTP/1.0\r\n");
    if let Some(h) = host {
        req.push_str(&format!("Host: {h}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    parse(&String::from_utf8_lossy(&buf))
}

/// One POST of a form (`application/x-www-form-urlencoded` `body`) to `path`, `Host`
/// `localhost`, with `headers`.
pub fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!(
        "POST {path} HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    parse(&String::from_utf8_lossy(&buf))
}

/// A response's status line, headers and body.
pub fn parse(buf: &str) -> Response {
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((buf, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

/// The value of header `name` (lower case).
pub fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// `check-config` of a replica file with this `[http]` section, written under `dir`:
/// (success, stdout and stderr).
pub fn check_config(dir: &std::path::Path, http: &str) -> (bool, String) {
    let path = dir.join("r.toml");
    std::fs::write(
        &path,
        format!("[replica]\nid = \"c\"\n[database]\ndsn = \"host=127.0.0.1 dbname=x\"\n[http]\n{http}\n"),
    )
    .unwrap();
    let o = std::process::Command::new(crate::replica::binary())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
    )
}

/// Writes `text` to `dir/name` with permissions `mode` (a token or password file); its path.
pub fn secret_file(dir: &std::path::Path, name: &str, text: &str, mode: u32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p.display().to_string()
}
