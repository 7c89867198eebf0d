//! A process's established TCP connections, from `/proc`: what a test or the bench counts
//! to see how many connections a client holds to the API server.

use std::collections::HashSet;

/// The established TCP connections of process `pid` (to `remote_port` only, if given): the
/// sockets among its open files (`/proc/PID/fd`) that `/proc/PID/net/tcp{,6}` shows in
/// state 01.
pub fn established_connections(pid: u32, remote_port: Option<u16>) -> usize {
    let sockets: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let port = remote_port.map(|p| format!(":{p:04X}"));
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok())
        .map(|table| {
            table
                .lines()
                .skip(1)
                .filter(|line| {
                    // local address, remote address, state, ..., inode (the 10th field)
                    let f: Vec<&str> = line.split_whitespace().collect();
                    f.len() > 9
                        && f[3] == "01"
                        && port.as_deref().is_none_or(|p| f[2].ends_with(p))
                        && sockets.contains(f[9])
                })
                .count()
        })
        .sum()
}
