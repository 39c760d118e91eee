//! Who is asking, and whether a POST may act (docs/console.md, "Roles" and "Actions").
//!
//! - A request's credentials are compared (in constant time) with every credential of
//!   `[http] console_auth_file`; the one that matches names the user and the role (`viewer`,
//!   `operator`). Without a file (a loopback console) pages are open and nobody may act.
//! - An action is a POST that must (1) come from this console's own pages: `Sec-Fetch-Site:
//!   same-origin`, or, from a client that sends no `Sec-Fetch-Site`, an `Origin` naming the
//!   request's own `Host` (a browser on a `Referrer-Policy: no-referrer` page sends `Origin:
//!   null` with a form post, so the fetch metadata is what a browser is judged by); and (2)
//!   carry the page's token: an HMAC-SHA256, under a secret drawn when the process starts, of
//!   the user and the minute the page was rendered, valid for [`TOKEN_TTL_S`]. No cookie is
//!   set: the token travels in the form, and the credentials in the `Authorization` header
//!   the browser already sends.

use actix_web::http::header;
use actix_web::HttpRequest;
use sha2::{Digest, Sha256};

use crate::config::{ConsoleAuth, ConsoleRole, CredentialSecret};

/// How long a page's action token is accepted.
pub const TOKEN_TTL_S: u64 = 3600;

/// The user of a request that matched a credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Who {
    pub user: String,
    pub role: ConsoleRole,
}

impl Who {
    pub fn may_act(&self) -> bool {
        self.role == ConsoleRole::Operator
    }
}

/// The credential the request's `Authorization` header matches, if any. Every credential is
/// compared, whichever matches, so the time taken does not tell which one did.
pub fn identify(auth: &ConsoleAuth, req: &HttpRequest) -> Option<Who> {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let bearer = given.strip_prefix("Bearer ").map(str::trim);
    let basic = given.strip_prefix("Basic ").map(str::trim);
    let mut found = None;
    for c in &auth.credentials {
        let hit = match &c.secret {
            CredentialSecret::Bearer(token) => {
                bearer.is_some_and(|t| same(t.as_bytes(), token.expose().as_bytes()))
            }
            CredentialSecret::Basic { user, password } => {
                let want = basic_value(user, password.expose());
                basic.is_some_and(|b| same(b.as_bytes(), want.as_bytes()))
            }
        };
        if hit && found.is_none() {
            found = Some(Who {
                user: c.user.clone(),
                role: c.role,
            });
        }
    }
    found
}

/// Whether the file holds a basic credential (the 401's challenge then asks for one, so a
/// browser shows its login prompt).
pub fn wants_basic(auth: &ConsoleAuth) -> bool {
    auth.credentials
        .iter()
        .any(|c| matches!(c.secret, CredentialSecret::Basic { .. }))
}

/// Why a POST was refused before it could act.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not from this console's pages (another site's form, or a client that says nothing).
    CrossOrigin,
    /// No token, a token of another user, a forged one, or an expired one.
    Token,
    /// The user's role may not act (a viewer), or the console has no credentials file.
    Role,
}

impl Refusal {
    pub fn message(&self) -> &'static str {
        match self {
            Refusal::CrossOrigin => {
                "403 Forbidden: actions are accepted only from this console's own pages (same origin)"
            }
            Refusal::Token => {
                "403 Forbidden: the page's action token is missing, forged or expired; reload the page and try again"
            }
            Refusal::Role => {
                "403 Forbidden: only an operator of [http] console_auth_file may act from the console"
            }
        }
    }
}

/// Whether the request comes from a page of this console (see the module's doc).
pub fn same_origin(req: &HttpRequest) -> bool {
    let h = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(site) = h("sec-fetch-site") {
        return site == "same-origin";
    }
    match (h("origin"), h("host")) {
        (Some(origin), Some(host)) if origin != "null" => origin
            .split_once("://")
            .is_some_and(|(scheme, rest)| matches!(scheme, "http" | "https") && rest == host),
        _ => false,
    }
}

/// The per-process secret of the action tokens.
pub struct TokenKey([u8; 32]);

impl TokenKey {
    /// A fresh random key (drawn from the operating system through `uuid`'s v4).
    pub fn random() -> TokenKey {
        let mut k = [0u8; 32];
        k[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        k[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        TokenKey(k)
    }

    /// The token of a page rendered for `user` at `now_s` (Unix seconds): `SECONDS.MAC`.
    pub fn token(&self, user: &str, now_s: u64) -> String {
        format!("{now_s}.{}", hex::encode(self.mac(user, now_s)))
    }

    /// Whether `token` is one this key made for `user` within [`TOKEN_TTL_S`] of `now_s`.
    pub fn verify(&self, user: &str, token: &str, now_s: u64) -> bool {
        let Some((at, mac)) = token.split_once('.') else {
            return false;
        };
        let Ok(at) = at.parse::<u64>() else {
            return false;
        };
        let fresh = at <= now_s + 60 && now_s.saturating_sub(at) <= TOKEN_TTL_S;
        let want = hex::encode(self.mac(user, at));
        same(mac.as_bytes(), want.as_bytes()) && fresh
    }

    fn mac(&self, user: &str, at: u64) -> [u8; 32] {
        hmac_sha256(
            &self.0,
            format!("qlsched console action\n{user}\n{at}").as_bytes(),
        )
    }
}

/// HMAC-SHA256 (RFC 2104) of `msg` under a key of at most one block.
fn hmac_sha256(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for (i, k) in key.iter().enumerate() {
        ipad[i] ^= k;
        opad[i] ^= k;
    }
    let inner = Sha256::new()
        .chain_update(ipad)
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(opad)
        .chain_update(inner)
        .finalize()
        .into()
}

/// Unix seconds now (the token's clock: this process's, as it is the only one that checks).
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Base64 of `user:password` (RFC 7617), what a browser sends.
pub(super) fn basic_value(user: &str, password: &str) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("{user}:{password}");
    let bytes = input.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Compares without stopping at the first difference.
pub(super) fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_encode_as_browsers_send_them() {
        // RFC 7617's example.
        assert_eq!(
            basic_value("Aladdin", "open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(basic_value("a", "b"), "YTpi");
        assert_eq!(basic_value("ab", "c"), "YWI6Yw==");
    }

    #[test]
    fn comparison_needs_equal_length_and_bytes() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2_shape() {
        // RFC 4231 test case 2 uses a 4-byte key; ours is 32 bytes zero-padded the same way.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex::encode(hmac_sha256(&key, b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_token_holds_for_its_user_within_its_hour_only() {
        let k = TokenKey::random();
        let t = k.token("alice", 1_000_000);
        assert!(k.verify("alice", &t, 1_000_000));
        assert!(k.verify("alice", &t, 1_000_000 + TOKEN_TTL_S));
        assert!(
            !k.verify("alice", &t, 1_000_000 + TOKEN_TTL_S + 1),
            "expired"
        );
        assert!(!k.verify("bob", &t, 1_000_000), "another user's");
        assert!(
            !TokenKey::random().verify("alice", &t, 1_000_000),
            "another process's"
        );
        let forged = format!("{}.{}", 1_000_000, "0".repeat(64));
        assert!(!k.verify("alice", &forged, 1_000_000));
        assert!(!k.verify("alice", "", 1_000_000));
        let moved = t.replacen("1000000", "1000001", 1);
        assert!(!k.verify("alice", &moved, 1_000_000), "time edited");
    }
}
