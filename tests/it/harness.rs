//! The test kit's own promises that the other tests rest on.

use std::collections::HashSet;
use std::net::{TcpListener, TcpStream};

use crate::helpers::pg::{ephemeral_port_range, free_port};

/// A port handed to a server a test starts must not be one an outgoing connection can take as
/// its source port between the hand-out and the server's bind: that made a benchmark replica
/// fail with "Address already in use" when a pool connection had taken its port. Ports come
/// from outside the ephemeral range and one process never gets the same port twice.
#[test]
fn the_ports_handed_to_test_servers_are_never_an_outgoing_connections_source_port() {
    let (lo, hi) = ephemeral_port_range();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = listener.local_addr().unwrap();
    // Source ports the kernel picks for outgoing connections, while ports are handed out.
    let mut sources = HashSet::new();
    let mut handed = Vec::new();
    for _ in 0..300 {
        let c = TcpStream::connect(target).unwrap();
        let _accepted = listener.accept().unwrap();
        sources.insert(c.local_addr().unwrap().port());
        handed.push(free_port());
    }
    for p in &handed {
        assert!(
            !(lo..=hi).contains(p),
            "port {p} is inside the ephemeral range {lo}-{hi}"
        );
        assert!(
            !sources.contains(p),
            "port {p} was an outgoing connection's source port"
        );
    }
    let distinct: HashSet<_> = handed.iter().collect();
    assert_eq!(
        distinct.len(),
        handed.len(),
        "a port was handed out twice: {handed:?}"
    );
}
