//! Process memory and CPU figures from `/proc`: a process's resident set (`VmRSS`, and its
//! `RssAnon` and `RssFile` parts) and peak (`VmHWM`, resettable through `clear_refs`). It must
//! never signal or otherwise touch the processes it reads.

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

/// The resident set's two parts in bytes: anonymous memory (heap, stacks) and file pages (the
/// binary's code and data as far as they were read).
pub fn rss_parts(pid: u32) -> Option<(u64, u64)> {
    Some((status_field(pid, "RssAnon")?, status_field(pid, "RssFile")?))
}

/// [`rss_parts`] as a note says them (`12.3 MiB anonymous, 24.0 MiB of file pages`); zeros when
/// the process is gone.
pub fn rss_parts_note(pid: u32) -> String {
    let (anon, file) = rss_parts(pid).unwrap_or_default();
    format!("{:.1} MiB anonymous, {:.1} MiB of file pages", mib(anon), mib(file))
}

/// The peak resident set size in bytes since start or the last [`reset_peak`].
pub fn peak(pid: u32) -> Option<u64> {
    status_field(pid, "VmHWM")
}

/// Resets the peak to the current RSS (`echo 5 > /proc/<pid>/clear_refs`); false if refused.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// The processes of the Kubernetes pod whose uid is `pod_uid` (their cgroup path names it, as
/// `pod<uid>` with dashes under the cgroupfs driver or underscores under systemd's) whose
/// program (`argv[0]`) ends with `program`, by pid.
pub fn pod_processes(pod_uid: &str, program: &str) -> Vec<u32> {
    let marks = [format!("pod{pod_uid}"), format!("pod{}", pod_uid.replace('-', "_"))];
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let argv0 = std::fs::read(format!("/proc/{pid}/cmdline")).ok().and_then(|c| {
                let first = c.split(|b| *b == 0).next()?.to_vec();
                String::from_utf8(first).ok()
            });
            argv0.is_some_and(|a| a.ends_with(program))
                && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|c| marks.iter().any(|m| c.contains(m.as_str())))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Bytes to MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// CPU time a process has used so far (user + system, all its threads; not its children), from
/// `/proc/<pid>/stat`, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu_ticks(&text).map(|t| t as f64 / clock_ticks_per_second())
}

/// `utime + stime` (clock ticks) from a `/proc/<pid>/stat` line (fields 14 and 15; the command
/// name in parentheses may hold spaces, so fields are counted after its closing parenthesis).
pub fn parse_stat_cpu_ticks(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// `sysconf(_SC_CLK_TCK)`: 100 on Linux for every architecture the bench runs on.
fn clock_ticks_per_second() -> f64 {
    100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_anonymous_and_file_pages_within_its_resident_set() {
        let pid = std::process::id();
        let (anon, file) = rss_parts(pid).unwrap();
        assert!(anon > 0 && file > 0);
        // The two are read one after the other: the heap may grow between the reads.
        assert!(anon + file <= rss(pid).unwrap() + 16 * 1024 * 1024);
    }

    #[test]
    fn stat_cpu_ticks() {
        let line = "1234 (haptic ctl) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 40 3 2 20 0 5 0 100 1000 200";
        assert_eq!(parse_stat_cpu_ticks(line), Some(290));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

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
