//! Loopback ports for the processes tests and benches start.

/// The first of `n` consecutive loopback ports free right now, below the kernel's ephemeral
/// range. A port probed free inside that range (`bind(:0)`) can be taken by any outgoing
/// connection before the process handed it binds, or between a kill and a restart on it; below
/// the range only an explicit bind takes it.
pub fn free_loopback_ports(n: u16) -> std::io::Result<u16> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let first = 10_000u16;
    let span = u64::from(low.saturating_sub(n).saturating_sub(first).max(1));
    // Calls from one process start apart (a counter), since threads can read the same clock.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let seed = (u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos())))
    .wrapping_add(call.wrapping_mul(u64::from(n) + 1_009));
    (0..span)
        .map(|i| first + ((seed.wrapping_add(i * 97)) % span) as u16)
        .find(|&base| {
            (base..base.saturating_add(n))
                .all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
        .ok_or_else(|| std::io::Error::other("no free loopback ports below the ephemeral range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_are_free_and_below_the_ephemeral_range() {
        let base = free_loopback_ports(10).expect("ports");
        assert!((10_000..32_768).contains(&base), "{base}");
        for p in base..base + 10 {
            std::net::TcpListener::bind(("127.0.0.1", p)).expect("free");
        }
    }
}
