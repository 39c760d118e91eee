//! Failed console logins per client address: at most `limit` in a fixed window of a
//! minute; past that the address gets 429 (with `Retry-After`) until its window ends, right
//! credentials or not, so a guess is never confirmed while throttled. The table is bounded:
//! expired windows are dropped when it grows, and past `MAX_ADDRESSES` the addresses not
//! yet seen share one window (a flood from many addresses throttles itself).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);
const MAX_ADDRESSES: usize = 4096;
/// Where addresses beyond `MAX_ADDRESSES` are counted.
const OVERFLOW: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

pub(crate) struct Throttle {
    limit: u32,
    windows: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Throttle {
    pub(crate) fn new(limit: u32) -> Throttle {
        Throttle {
            limit,
            windows: Mutex::new(HashMap::new()),
        }
    }

    fn key(map: &mut HashMap<IpAddr, (Instant, u32)>, ip: IpAddr, now: Instant) -> IpAddr {
        if map.contains_key(&ip) || map.len() < MAX_ADDRESSES {
            return ip;
        }
        map.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
        if map.len() < MAX_ADDRESSES {
            ip
        } else {
            OVERFLOW
        }
    }

    /// `Some(wait)`: `ip` used up its failures in this window; try again after `wait`.
    pub(crate) fn blocked(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let key = if map.contains_key(&ip) { ip } else { OVERFLOW };
        let (start, failures) = *map.get(&key)?;
        let left = WINDOW.checked_sub(now.duration_since(start))?;
        (failures >= self.limit && !left.is_zero()).then_some(left)
    }

    /// Counts one failed login of `ip`.
    pub(crate) fn failed(&self, ip: IpAddr, now: Instant) {
        let mut map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let key = Self::key(&mut map, ip, now);
        let w = map.entry(key).or_insert((now, 0));
        if now.duration_since(w.0) >= WINDOW {
            *w = (now, 0);
        }
        w.1 = w.1.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_blocked_after_the_limit_until_its_window_ends() {
        let t = Throttle::new(3);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(t.blocked(ip, t0), None);
            t.failed(ip, t0);
        }
        let wait = t.blocked(ip, t0 + Duration::from_secs(10)).unwrap();
        assert_eq!(wait, Duration::from_secs(50));
        assert_eq!(t.blocked(other, t0), None);
        assert_eq!(t.blocked(ip, t0 + WINDOW), None);
        t.failed(ip, t0 + WINDOW);
        assert_eq!(t.blocked(ip, t0 + WINDOW), None, "a new window");
    }

    #[test]
    fn addresses_beyond_the_table_share_one_window() {
        let t = Throttle::new(1);
        let t0 = Instant::now();
        for i in 0..MAX_ADDRESSES as u32 {
            t.failed(IpAddr::from(i.to_be_bytes()), t0);
        }
        let late: IpAddr = "2001:db8::1".parse().unwrap();
        t.failed(late, t0);
        assert!(t.blocked(late, t0).is_some());
        assert!(t.blocked("2001:db8::2".parse().unwrap(), t0).is_some());
    }
}
