//! Process liveness checks used to prove that no HAProxy process outlives a test.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// Whether `pid` names a live process (exists and is not a zombie waiting to be reaped).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    match kill(Pid::from_raw(raw), None) {
        Err(Errno::ESRCH) => false,
        // EPERM: exists but belongs to someone else; count it as alive.
        Ok(()) | Err(_) => !is_zombie(pid),
    }
}

/// Whether `/proc/<pid>/stat` reports state `Z` (exited, not yet reaped) or the process vanished.
fn is_zombie(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may itself contain spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// The live (non-zombie) processes whose process group is `pgid`, found by scanning `/proc`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // Fields after the command: state ppid pgrp ...
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.len() > 2 && f[0] != "Z" && f[0] != "X" && f[2] == pgid.to_string()
        })
        .collect()
}

/// Waits up to 5 s for every pid to be gone and panics, naming the survivors, otherwise.
pub fn assert_no_stray(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|p| pid_alive(*p)).collect();
        if alive.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("stray HAProxy processes still alive: {alive:?} (of {pids:?})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_is_alive_and_bogus_pid_is_not() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(u32::MAX));
        assert_no_stray(&[]);
        assert!(group_members(u32::MAX).is_empty());
    }
}
