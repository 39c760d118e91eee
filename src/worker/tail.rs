//! The bounded tail of an attempt's output (docs/worker.md, "Output"): the last bytes a
//! stream wrote, with secrets redacted before the cut, so a secret straddling the cut shows
//! in no part.

use super::secrets::Redactor;

/// The last `keep` bytes written.
#[derive(Debug, Default)]
pub struct Tail {
    buf: Vec<u8>,
    keep: usize,
    /// Bytes written in all (dropped ones included).
    pub total: u64,
}

impl Tail {
    pub fn new(keep: usize) -> Tail {
        Tail {
            buf: Vec::with_capacity(keep.min(64 * 1024)),
            keep,
            total: 0,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > self.keep * 2 {
            let cut = self.buf.len() - self.keep;
            self.buf.drain(..cut);
        }
    }

    /// At most `bound` bytes of the end of the output as text (lossy UTF-8), redacted.
    pub fn text(&self, bound: usize, redactor: &Redactor) -> String {
        let start = self.buf.len().saturating_sub(self.keep);
        let text = redactor.redact(&String::from_utf8_lossy(&self.buf[start..]));
        last_bytes(&text, bound).to_string()
    }
}

/// The longest suffix of `s` of at most `bound` bytes that starts on a character boundary.
pub fn last_bytes(s: &str, bound: usize) -> &str {
    if s.len() <= bound {
        return s;
    }
    let mut i = s.len() - bound;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_end_and_redacts_before_the_cut() {
        let mut r = Redactor::default();
        r.add("SECRET");
        let mut t = Tail::new(8 + r.longest());
        for _ in 0..100 {
            t.push(b"0123456789");
        }
        t.push(b"xxSECRETyy");
        assert_eq!(t.total, 1010);
        let text = t.text(12, &r);
        assert!(text.ends_with("yy"), "{text}");
        assert!(!text.contains("SEC") && !text.contains("RET"), "{text}");
        assert!(text.len() <= 12);
        assert_eq!(last_bytes("héllo", 4), "llo");
    }
}
