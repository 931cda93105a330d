//! Process memory figures from `/proc`: a process's resident set (`VmRSS`) and peak (`VmHWM`, resettable through `clear_refs`). It must never signal or
//! otherwise touch the processes it reads.

/// A `kB` field of `/proc/<pid>/status`, in bytes.
fn status_field(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kb(&text, key)
}

/// Parses `Key:   1234 kB` from a `/proc/<pid>/status` text, in bytes.
pub fn parse_status_kb(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?;
    line[key.len() + 1..].split_whitespace().next()?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// The resident set size in bytes.
pub fn rss(pid: u32) -> Option<u64> {
    status_field(pid, "VmRSS")
}

/// The peak resident set size in bytes since start or the last [`reset_peak`].
pub fn peak(pid: u32) -> Option<u64> {
    status_field(pid, "VmHWM")
}

/// Resets the peak to the current RSS (`echo 5 > /proc/<pid>/clear_refs`); false if refused.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Bytes to MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_status() {
        let text = "Name:\tbench\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_status_kb(text, "VmRSS"), Some(1024 * 1024));
        assert_eq!(parse_status_kb(text, "VmHWM"), Some(2048 * 1024));
        assert_eq!(parse_status_kb(text, "Vm"), None);
        let me = std::process::id();
        assert!(rss(me).unwrap() > 0);
        assert!(peak(me).unwrap() >= rss(me).unwrap() / 2);
        assert_eq!(mib(1024 * 1024), 1.0);
    }
}
