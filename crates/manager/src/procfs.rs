//! Process CPU and memory from /proc, for `process_*` metrics and for `ccm bench`, which reads
//! the CCM child's numbers from outside. Linux only; elsewhere the readers return `None`.

/// One reading of a process's resource use.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcStats {
    /// User + system CPU time.
    pub cpu_seconds: f64,
    /// Resident set size now.
    pub rss_bytes: u64,
    /// Peak resident set size (VmHWM).
    pub peak_rss_bytes: u64,
    /// Virtual memory size.
    pub vsize_bytes: u64,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Open file descriptors.
    pub open_fds: u64,
}

/// Linux reports CPU times in clock ticks; 100 Hz on every mainstream distribution.
const CLOCK_TICKS: f64 = 100.0;
const PAGE_SIZE: u64 = 4096;

/// Reads this process.
pub fn read_self() -> Option<ProcStats> {
    read_path("self")
}

/// Reads process `pid`.
pub fn read_pid(pid: u32) -> Option<ProcStats> {
    read_path(&pid.to_string())
}

fn read_path(which: &str) -> Option<ProcStats> {
    let stat = std::fs::read_to_string(format!("/proc/{which}/stat")).ok()?;
    // The command name may contain spaces: fields start after the last ')'.
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state); field n is f[n - 3].
    let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let utime = num(14)?;
    let stime = num(15)?;
    let start_ticks = num(22)?;
    let vsize = num(23)?;
    let rss_pages = num(24)?;
    let btime = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("btime ")
                    .map(|v| v.trim().parse::<u64>().ok())
            })
        })
        .flatten()
        .unwrap_or(0);
    let peak = std::fs::read_to_string(format!("/proc/{which}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmHWM:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
        })
        .map(|kb| kb * 1024)
        .unwrap_or(rss_pages * PAGE_SIZE);
    let open_fds = std::fs::read_dir(format!("/proc/{which}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    Some(ProcStats {
        cpu_seconds: (utime + stime) as f64 / CLOCK_TICKS,
        rss_bytes: rss_pages * PAGE_SIZE,
        peak_rss_bytes: peak,
        vsize_bytes: vsize,
        start_time_seconds: btime as f64 + start_ticks as f64 / CLOCK_TICKS,
        open_fds,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_process() {
        let p = super::read_self().expect("linux /proc");
        assert!(p.rss_bytes > 0);
        assert!(p.peak_rss_bytes >= p.rss_bytes / 2);
        assert!(p.open_fds > 0);
    }
}
