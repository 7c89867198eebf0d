//! memcached's own runtime rules: the flag values a real memcached 1.6 refuses to start with
//! (item size, connections per thread, extstore pages and buffers, UDP beside extstore), the
//! least memory its flags make it use, and the flags the operator sets itself.
//!
//! The rules, and the messages quoted in them, are memcached 1.6's: memcached.c (`-I` and
//! its slab chunk, the `-c` limit), storage.c and extstore.c (extstore, and UDP beside it).
//! The operator's `tests/real_memcached.rs` and `tests/real_memcached_warm.rs` start
//! Debian's memcached 1.6 with every configuration the validation accepts, so none of these
//! rules is laxer than memcached. Each check returns the reason, readable by a person;
//! [`crate::validation`] names the field it concerns.

/// Smallest and largest `maxItemSize` memcached accepts with its default slab settings:
/// items are stored in chunks of at most half a slab page (512 KiB of the 1 MiB page), and
/// memcached 1.6 refuses to start when `-I` is smaller than a chunk ("slab_chunk_max cannot
/// be larger than -I") or not a whole number of chunks ("must be evenly divisible by
/// slab_chunk_max").
pub const MIN_ITEM_SIZE: u64 = ITEM_SIZE_STEP;
pub const MAX_ITEM_SIZE: u64 = 1024 * 1024 * 1024;
/// memcached's default `slab_chunk_max`: `maxItemSize` must be a multiple of it.
pub const ITEM_SIZE_STEP: u64 = 512 * 1024;

/// Parses memcached's `-I` syntax: bytes, or a `k`/`m` suffix (powers of 1024).
pub fn parse_item_size(value: &str) -> Result<u64, String> {
    let (digits, unit) = match value.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&value[..i], c.to_ascii_lowercase()),
        _ => (value, 'b'),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(
            "must be a number of bytes, optionally with a k or m suffix (e.g. 1m, 512k)".into(),
        );
    }
    let n: u64 = digits.parse().map_err(|_| "is too large".to_string())?;
    let bytes = match unit {
        'b' => Some(n),
        'k' => n.checked_mul(1024),
        'm' => n.checked_mul(1024 * 1024),
        _ => return Err(format!("has an unknown unit {unit:?}; use k or m")),
    };
    bytes.ok_or_else(|| "is too large".to_string())
}

/// Why memcached would refuse `-I value` beside `-m memory_mib`: it is not `-I` syntax, lies
/// outside [`MIN_ITEM_SIZE`]..=[`MAX_ITEM_SIZE`], is not a whole number of slab chunks, or
/// is more than half the cache.
pub fn check_item_size(value: &str, memory_mib: i32) -> Result<(), String> {
    match parse_item_size(value) {
        Err(reason) => Err(reason),
        Ok(bytes) if !(MIN_ITEM_SIZE..=MAX_ITEM_SIZE).contains(&bytes) => {
            Err("must be between 512k and 1024m".into())
        }
        Ok(bytes) if bytes % ITEM_SIZE_STEP != 0 => Err(
            "must be a multiple of 512k (memcached stores items in 512 KiB chunks and refuses to start otherwise), e.g. 512k, 1m, 1536k, 2m".into(),
        ),
        Ok(bytes) if bytes > u64::try_from(memory_mib.max(0)).unwrap_or(0) * 1024 * 1024 / 2 => {
            Err(format!(
                "must be at most half of memoryMiB ({memory_mib} MiB): memcached refuses to start otherwise"
            ))
        }
        Ok(_) => Ok(()),
    }
}

/// File descriptors memcached needs for each worker thread, and besides them (listening
/// sockets, standard streams, with room to spare), within its `-c` limit.
const FDS_PER_THREAD: i32 = 5;
const FDS_BASE: i32 = 8;

/// Why memcached would exit with `-c max_connections -t threads`.
pub fn check_connections(threads: i32, max_connections: i32) -> Result<(), String> {
    // memcached lowers its open-file limit to maxConnections and then needs about five
    // descriptors for each worker thread (an epoll instance and notification pipes) before
    // it serves anyone: below that it exits with "Too many open files" (measured with
    // Debian's memcached 1.6: 16 connections run at most 2 threads, 64 at most 12).
    let needed = threads
        .saturating_mul(FDS_PER_THREAD)
        .saturating_add(FDS_BASE);
    if max_connections < needed {
        return Err(format!(
            "must be at least {needed} for {threads} threads ({FDS_PER_THREAD} per thread + {FDS_BASE}): memcached limits its open files to maxConnections and exits with \"Too many open files\" otherwise; raise maxConnections or lower threads"
        ));
    }
    Ok(())
}

/// memcached flags the operator sets itself (from the spec) or must not be given
/// (daemon mode, another user or listen address would break the pod).
pub const MANAGED_FLAGS: [&str; 26] = [
    "-m",
    "--memory-limit",
    "-c",
    "--conn-limit",
    "-t",
    "--threads",
    "-I",
    "--max-item-size",
    "-p",
    "--port",
    "-l",
    "--listen",
    "-u",
    "--user",
    "-d",
    "--daemon",
    "-P",
    "--pidfile",
    "-v",
    "-vv",
    "-vvv",
    "-S",
    "--enable-sasl",
    "-Z",
    "--enable-ssl",
    "-s",
];

/// Whether the memcached argument `arg` sets something the operator manages: one of
/// [`MANAGED_FLAGS`] (with or without its value attached), or an `-o` option of TLS, the
/// slab sizes or extstore.
pub fn is_managed_flag(arg: &str) -> bool {
    let flag = arg.split('=').next().unwrap_or(arg);
    MANAGED_FLAGS.contains(&flag)
        // Short flags with the value attached (`-m64`, `-vv`).
        || MANAGED_FLAGS
            .iter()
            .any(|f| f.len() == 2 && arg.len() > 2 && arg.starts_with(f) && !arg.starts_with("--"))
        // TLS settings go through `-o ssl_*`, which the operator writes from `spec.tls`.
        || arg.contains("ssl_")
        // Slab sizes decide which `maxItemSize` memcached accepts; the validation of
        // `maxItemSize` assumes memcached's defaults.
        || arg.contains("slab_chunk_max")
        || arg.contains("slab_page_size")
        // extstore goes through `-o ext_*`, which the operator writes from `spec.extstore`.
        || arg.contains("ext_")
}

/// memcached's extstore write buffers held in memory: one per page bucket
/// (`PAGE_BUCKET_COUNT` in memcached 1.6's storage.c).
pub const EXTSTORE_WRITE_BUFFERS: i64 = 6;
/// Most extstore pages memcached accepts ("page_count must total to < 65536").
pub const EXTSTORE_MAX_PAGES: u64 = 65535;

/// Why memcached would refuse `mib` MiB as `ext_page_size` or `ext_wbuf_size` (extstore.c:
/// "page_size and wbuf_size must be divisible by 1024*1024*2").
pub fn check_extstore_alignment(mib: i32) -> Result<(), String> {
    if mib % 2 != 0 {
        return Err("must be even: memcached aligns extstore pages and write buffers to 2 MiB and refuses to start otherwise".into());
    }
    Ok(())
}

/// Why memcached would refuse write buffers of `write_buffer_mib` in pages of `page_mib`.
pub fn check_write_buffer_divides_page(page_mib: i32, write_buffer_mib: i32) -> Result<(), String> {
    if page_mib.checked_rem(write_buffer_mib) != Some(0) {
        return Err(format!(
            "must divide pageSizeMiB ({page_mib}) evenly: memcached refuses to start otherwise (\"page_size must be divisible by wbuf_size\")"
        ));
    }
    Ok(())
}

/// Why memcached would refuse write buffers of `write_buffer_mib` beside `-I max_item_size`.
/// An item size that does not parse passes: [`check_item_size`] reports it.
pub fn check_write_buffer_holds_items(
    write_buffer_mib: i32,
    max_item_size: &str,
) -> Result<(), String> {
    let Ok(item_max) = parse_item_size(max_item_size) else {
        return Ok(());
    };
    let wbuf = u64::try_from(write_buffer_mib.max(0)).unwrap_or(0) * 1024 * 1024;
    if item_max > wbuf {
        return Err(format!(
            "must hold the largest item: config.maxItemSize is {max_item_size} ({item_max} bytes); memcached refuses to start otherwise (\"-I cannot be larger than ext_wbuf_size\")"
        ));
    }
    Ok(())
}

/// Why `ext_item_size` of `item_size_bytes` is useless beside `-I max_item_size`: memcached
/// writes to disk only items at least that large, so none would go. An item size that does
/// not parse passes: [`check_item_size`] reports it.
pub fn check_extstore_item_size(item_size_bytes: i32, max_item_size: &str) -> Result<(), String> {
    let Ok(item_max) = parse_item_size(max_item_size) else {
        return Ok(());
    };
    if u64::try_from(item_size_bytes).unwrap_or(0) >= item_max {
        return Err(format!(
            "must be smaller than config.maxItemSize ({item_max} bytes), or no item would ever go to disk"
        ));
    }
    Ok(())
}

/// Why memcached would refuse an extstore file of `size_bytes`: it uses the whole pages of
/// `page_mib` that fit, and wants at least one and fewer than [`EXTSTORE_MAX_PAGES`].
pub fn check_extstore_pages(size_bytes: u64, page_mib: i32) -> Result<(), String> {
    let page = u64::try_from(page_mib).unwrap_or(1) * 1024 * 1024;
    let pages = size_bytes.checked_div(page).unwrap_or(0);
    if pages == 0 {
        return Err(format!(
            "must hold at least one page of pageSizeMiB ({page_mib} MiB)"
        ));
    }
    if pages >= EXTSTORE_MAX_PAGES {
        return Err(format!(
            "makes {pages} pages of {page_mib} MiB; memcached accepts fewer than {EXTSTORE_MAX_PAGES}: raise pageSizeMiB"
        ));
    }
    Ok(())
}

/// Why memcached refuses the arguments [`udp_flags`] finds while extstore is on.
pub const UDP_WITH_EXTSTORE: &str = "turns on UDP, which memcached refuses with extstore (\"Cannot use UDP with extstore enabled\")";

/// The arguments among `args` that turn UDP on: `-U` or `--udp-port` with a port other than
/// 0, given as the next argument or attached.
pub fn udp_flags(args: &[String]) -> Vec<&String> {
    let mut found = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "-U" | "--udp-port" => args.next().map(String::as_str),
            a if a.starts_with("--udp-port=") => a.strip_prefix("--udp-port="),
            a if a.starts_with("-U") => a.strip_prefix("-U"),
            _ => continue,
        };
        if value != Some("0") {
            found.push(arg);
        }
    }
    found
}

/// The least memory memcached's own flags make it use: the cache (`-m memory_mib`, which it
/// fills) and, with extstore, [`EXTSTORE_WRITE_BUFFERS`] write buffers of
/// `extstore_write_buffer_mib`. memcached starts below it (it touches that memory only as
/// it uses it) and is OOM-killed once its cache and buffers fill: measured with memcached
/// 1.6.38 in a 32 MiB memory cgroup, `-m 64` with six 64 MiB write buffers was killed after
/// 27 MiB of items.
pub fn memory_floor_mib(memory_mib: i32, extstore_write_buffer_mib: Option<i32>) -> i64 {
    i64::from(memory_mib.max(0))
        + extstore_write_buffer_mib.map_or(0, |w| EXTSTORE_WRITE_BUFFERS * i64::from(w.max(0)))
}

/// Why `bytes` of memory (a request or a limit) is too little for memcached: less than
/// [`memory_floor_mib`].
pub fn check_memory_floor(
    bytes: u64,
    memory_mib: i32,
    extstore_write_buffer_mib: Option<i32>,
) -> Result<(), String> {
    let needed_mib = memory_floor_mib(memory_mib, extstore_write_buffer_mib);
    if bytes >= u64::try_from(needed_mib).unwrap_or(0) * 1024 * 1024 {
        return Ok(());
    }
    Err(match extstore_write_buffer_mib {
        Some(wbuf) => format!(
            "must cover the cache (config.memoryMiB, {memory_mib} MiB) and extstore's {EXTSTORE_WRITE_BUFFERS} write buffers of {wbuf} MiB: at least {needed_mib}Mi"
        ),
        None => format!(
            "must cover the cache (config.memoryMiB, {memory_mib} MiB): at least {needed_mib}Mi"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_sizes_parse_like_memcached() {
        assert_eq!(parse_item_size("1m"), Ok(1024 * 1024));
        assert_eq!(parse_item_size("512k"), Ok(512 * 1024));
        assert_eq!(parse_item_size("2048"), Ok(2048));
        assert_eq!(parse_item_size("3M"), Ok(3 * 1024 * 1024));
        assert!(parse_item_size("").is_err());
        assert!(parse_item_size("m").is_err());
        assert!(parse_item_size("1.5m").is_err());
        assert!(parse_item_size("99999999999999999999m").is_err());
    }
}
