//! The route configuration rendered into the proxy's ConfigMap: one ring of slots per copy
//! in memcached's route library, the reads' failover and the writes' fan-out, and the cron
//! that reloads the file when the kubelet replaces it.

use std::fmt::Write as _;

use memcached_api::ProxyBackend;

use super::RELOAD_CHECK_SECONDS;
use super::slots::MAX_SLOT;

/// `route` through the gutter route in `mode` (see `gutter.lua`), where the proxy has it
/// (its command loads the start file); `route` alone where it does not: a proxy started
/// before the gutter was turned on loads this file until it is replaced, and an unknown
/// route would stop it.
fn through_gutter(route: &str, mode: &str, ttl: i32, meta: bool) -> String {
    let meta = if meta { ", meta = true" } else { "" };
    format!(
        "route_gutter and route_gutter{{ child = {route}, child_gutter = \"internal\", mode = \"{mode}\", ttl = {ttl}{meta} }} or ({route})"
    )
}

/// A Lua string literal of `s`.
fn lua_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii_graphic() || c == ' ' => out.push(c),
            c => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "\\{b:03}");
                }
            }
        }
    }
    out.push('"');
    out
}

/// The route configuration for `backends` (see the module documentation), naming `file`
/// as its own path for the reload check, and its version (a hash of everything else in
/// it). The first line carries the version.
pub fn render(owner: &str, backends: &[ProxyBackend], copies: i32, file: &str) -> (String, String) {
    render_warm(owner, backends, &[], None, copies, None, file)
}

/// [`render`], with keys warming up from the ring `warm` (one copy only; entries in the
/// form of `backends`, a vacant entry keeping its position): where the keys lived before.
/// For a pod being replaced, the current ring with the old pod in its slot and the other
/// slots vacant; for a ring grown by a slot, the previous ring. Reads (`get`, `mg`) that
/// miss go on to the key's pod in `warm` through the warm-up route
/// ([`super::WARM_ROUTE`], a start file of its own) and writes reach that pod too, so a
/// value it still holds is never older than the new pod's. With no pod in `warm` the text
/// is exactly [`render`]'s. Ignored with more than one copy.
///
/// For a replacement (`spec.proxy.warmUp`, [`super::membership`]'s `warm_from`) a key's
/// two pods are always two pods. With `moved_from`, `warm` is the ring before a scale-out
/// ([`super::warm_growth`]), that many slots long: only the keys of the slots from there on
/// moved, and only those are read from `warm` and written to it. A ring of the current
/// length with those slots down (`unmoved`) tells them apart: a key that did not move is
/// read and written through it, once (twice would apply an `incr`, a `decr`, an `append`
/// or a `prepend` twice); a moved key's writes reach its former pod first, then the new
/// one (the warm-up write route). A `moved_from` that is not shorter than the ring
/// renders no warm-up at all.
///
/// With `gutter_ttl` (`spec.proxy.gutter`, one copy only), the proxy's own cache is a
/// gutter through the gutter route ([`super::GUTTER_ROUTE`], a start file of its own): a
/// read (`get`, `gets`, `mg`) whose pod fails (down, unreachable, its slot vacant) is
/// answered from it; a write the pod fails (`set`, `add`, `cas`, `replace`, `ms`) is kept
/// there with the TTL `gutter_ttl`, a change (`delete`, `md`, `incr`, `decr`, `append`,
/// `prepend`, `ma`) is made there, and the client still gets the pod's error; a write the
/// pod takes drops the key from the gutter. `touch`, `gat` and `gats` never reach it, and
/// the TTL flags of meta commands are held to `gutter_ttl` there.
pub fn render_warm(
    owner: &str,
    backends: &[ProxyBackend],
    warm: &[ProxyBackend],
    moved_from: Option<i32>,
    copies: i32,
    gutter_ttl: Option<i32>,
    file: &str,
) -> (String, String) {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "-- Proxy routes of the Memcached {owner}, written by memcached-operator from the\n\
         -- pool's pods in their slots. Edits are overwritten."
    );
    let _ = writeln!(body, "local path = {}", lua_string(file));
    // Each copy's ring, position by position: the slot's pod, or nothing (vacant).
    let groups: Vec<(i32, Vec<Option<&ProxyBackend>>)> = (1..=copies.max(1))
        .map(|copy| (copy, ring_of(backends, copy)))
        .filter(|(_, ring)| !ring.is_empty())
        .collect();
    // `vacant` labels a position without a pod.
    let pool = |out: &mut String,
                indent: &str,
                copy: i32,
                ring: &[Option<&ProxyBackend>],
                vacant: &str| {
        // Jump consistent hashing (memcached's `mcp.dist_jump_hash`, keys hashed with
        // XXH3): a key's backend is its position in this list, and the position depends
        // on the key and the list's length only, never on an address. So the pod that
        // takes a slot serves exactly that slot's keys, and a ring grown by one slot at
        // its end moves 1/(n+1) of the keys, all to the new slot.
        let _ = writeln!(out, "{indent}options = {{ dist = mcp.dist_jump_hash }},");
        let _ = writeln!(out, "{indent}backends = {{");
        if ring.is_empty() {
            // No pod at all: one backend marked down, so the proxy starts and answers
            // every request with an error instead of refusing the configuration.
            let _ = writeln!(
                out,
                "{indent}    {{ label = \"no-ready-pods\", host = \"127.0.0.1\", port = \"1\", down = true }},"
            );
        }
        for (slot, b) in ring.iter().enumerate() {
            let Some(b) = b else {
                // A vacant slot keeps its position (so no other slot's keys move), marked
                // down: its reads miss and its writes fail until a new pod takes it. The
                // label cannot be a pod's (no `:` in pod names).
                let _ = writeln!(
                    out,
                    "{indent}    {{ label = \"{vacant}:{copy}:{slot}\", host = \"127.0.0.1\", port = \"1\", down = true }},"
                );
                continue;
            };
            let (host, port) = b.address.rsplit_once(':').unwrap_or((&b.address, ""));
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let _ = writeln!(
                out,
                "{indent}    {{ label = {}, host = {}, port = {} }},",
                lua_string(&b.pod),
                lua_string(host),
                lua_string(port)
            );
        }
        let _ = writeln!(out, "{indent}}},");
    };
    // A read that fails (its backend is down) answers a miss, as a client of a lost pod
    // would see: the null route after the real one (which asks the gutter first, with one).
    let reads = |body: &mut String, route: &dyn Fn(&str) -> String, gutter: Option<i32>| {
        for read in ["get", "gets", "gat", "gats", "mg"] {
            let route = match gutter {
                Some(ttl) if ["get", "gets", "mg"].contains(&read) => {
                    through_gutter(&route(read), "read", ttl, read == "mg")
                }
                _ => route(read),
            };
            let _ = writeln!(
                body,
                "        {read} = route_failover{{ children = {{ {route}, route_null{{}} }} }},"
            );
        }
    };
    body.push_str("pools{\n");
    if groups.len() <= 1 {
        body.push_str("    pool = {\n");
        let (copy, ring) = groups
            .first()
            .map_or((1, &[][..]), |(c, r)| (*c, r.as_slice()));
        pool(&mut body, "        ", copy, ring, "vacant");
        body.push_str("    },\n");
        // The ring keys are warmed from (a vacant position is rendered down); a previous
        // ring no shorter than the ring has nothing to warm.
        let moved_from = moved_from.map(|from| usize::try_from(from).unwrap_or(usize::MAX));
        let predecessors = match moved_from {
            Some(from) if from >= ring.len() => Vec::new(),
            _ => ring_of(warm, copy),
        };
        let warming = predecessors.iter().any(Option::is_some);
        let moved_from = moved_from.filter(|_| warming);
        if warming {
            body.push_str("    warm = {\n");
            pool(&mut body, "        ", copy, &predecessors, "cold");
            body.push_str("    },\n");
        }
        // With a previous ring: the current ring with the slots it did not have down.
        if let Some(from) = moved_from {
            let unmoved: Vec<Option<&ProxyBackend>> = ring
                .iter()
                .enumerate()
                .map(|(slot, b)| b.filter(|_| slot < from))
                .collect();
            body.push_str("    unmoved = {\n");
            pool(&mut body, "        ", copy, &unmoved, "moved");
            body.push_str("    },\n");
        }
        let unmoved = if moved_from.is_some() {
            ", child_unmoved = \"unmoved\""
        } else {
            ""
        };
        body.push_str("}\nroutes{\n    cmap = {\n");
        let plain = "route_direct{ child = \"pool\" }".to_string();
        // Writes and deletes reach a warming slot's predecessor as well (its answer is not
        // awaited), so a later read through it cannot bring back a value overwritten or
        // deleted.
        let writes = if moved_from.is_some() {
            format!(
                "route_warm_write and route_warm_write{{ child = \"pool\", child_warm = \"warm\"{unmoved} }} or route_direct{{ child = \"pool\" }}"
            )
        } else if warming {
            "route_split{ child_a = \"pool\", child_b = \"warm\" }".to_string()
        } else {
            plain.clone()
        };
        // The warm-up route where the proxy has it (its command loads the start file), the
        // plain one where it does not: a proxy started before warm-up was turned on loads
        // this file until it is replaced, and an unknown route would stop it.
        let warm = |options: &str| {
            format!(
                "route_warm and route_warm{{ child = \"pool\", child_warm = \"warm\"{unmoved}{options} }} or route_direct{{ child = \"pool\" }}"
            )
        };
        reads(
            &mut body,
            &|read| match read {
                "get" if warming => warm(""),
                "mg" if warming => warm(", meta = true"),
                _ => plain.clone(),
            },
            gutter_ttl,
        );
        if let Some(ttl) = gutter_ttl {
            let stores = ["set", "add", "cas", "replace", "ms"].map(|c| (c, "store"));
            let changes =
                ["delete", "md", "incr", "decr", "append", "prepend", "ma"].map(|c| (c, "change"));
            for (command, mode) in stores.into_iter().chain(changes) {
                let meta = command.starts_with('m');
                let _ = writeln!(
                    body,
                    "        {command} = {},",
                    through_gutter(&writes, mode, ttl, meta)
                );
            }
        }
        let _ = writeln!(body, "    }},\n    default = {writes},\n}}");
    } else {
        // Each copy's zone (`spec.proxy.zones`, recorded on every slot of its ring), when
        // every copy has one of its own.
        let zones: Vec<&str> = groups
            .iter()
            .filter_map(|(copy, _)| {
                backends
                    .iter()
                    .find(|b| b.copy == *copy)
                    .and_then(|b| b.zone.as_deref())
            })
            .collect();
        let zoned = zones.len() == groups.len()
            && zones
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                == zones.len();
        let set = if zoned { "set_zones" } else { "set_copies" };
        let _ = writeln!(body, "    {set} = {{");
        for (i, (copy, ring)) in groups.iter().enumerate() {
            match zones.get(i).filter(|_| zoned) {
                Some(zone) => {
                    let _ = writeln!(body, "        [{}] = {{", lua_string(zone));
                }
                None => body.push_str("        {\n"),
            }
            pool(&mut body, "            ", *copy, ring, "vacant");
            body.push_str("        },\n");
        }
        body.push_str("    },\n}\n");
        // One copy answers; a miss or an error there asks the next. With zones, the proxy
        // pod's own zone first (from its environment: the pod's zone label, set when it was
        // scheduled), passed to the route itself (the route library's global local zone
        // is not read by `route_failover`); without it, in a random order per worker.
        let read = if zoned {
            // A zone that is none of the copies' (or none) reads them in a random order.
            let known: Vec<String> = zones
                .iter()
                .map(|z| format!("[{}] = true", lua_string(z)))
                .collect();
            let _ = writeln!(
                body,
                "local zone = os.getenv({})\nif ({{ {} }})[zone or \"\"] == nil then zone = nil end",
                lua_string(super::ZONE_ENV),
                known.join(", ")
            );
            "route_failover{ children = \"set_zones\", miss = true, local_zone = zone, shuffle = zone == nil }"
        } else {
            "route_failover{ children = \"set_copies\", miss = true, shuffle = true }"
        };
        body.push_str("routes{\n    cmap = {\n");
        reads(&mut body, &|_| read.to_string(), None);
        body.push_str("    },\n");
        // Writes go to every copy and answer with the first success.
        let _ = writeln!(
            body,
            "    default = route_allfastest{{ children = \"{set}\" }},\n}}"
        );
    }
    let version = version_of(&body);
    let _ = write!(
        body,
        "-- Reload when the kubelet has replaced this file with another version.\n\
         mcp.register_cron(\"memcached-operator-reload\", {{\n    \
             every = {RELOAD_CHECK_SECONDS},\n    \
             func = function()\n        \
                 local f = io.open(path, \"r\")\n        \
                 if f == nil then return end\n        \
                 local first = f:read(\"l\")\n        \
                 f:close()\n        \
                 if first ~= nil and first ~= {} then\n            \
                     mcp.schedule_config_reload()\n        \
                 end\n    \
             end,\n\
         }})\n",
        lua_string(&version_line(&version)),
    );
    let text = format!("{}\n{body}", version_line(&version));
    (text, version)
}

/// Copy `copy`'s ring of `entries`, position by position: the slot's pod, or nothing (a
/// vacant entry, or no entry, below the last one); the first pod recorded in a slot wins.
fn ring_of(entries: &[ProxyBackend], copy: i32) -> Vec<Option<&ProxyBackend>> {
    let mut ring: Vec<Option<&ProxyBackend>> = Vec::new();
    for b in entries
        .iter()
        .filter(|b| b.copy == copy && (0..MAX_SLOT).contains(&b.slot))
    {
        let at = b.slot as usize;
        if ring.len() <= at {
            ring.resize(at + 1, None);
        }
        if !b.is_vacant() && ring[at].is_none() {
            ring[at] = Some(b);
        }
    }
    ring
}

fn version_line(version: &str) -> String {
    format!("-- version {version}")
}

fn version_of(body: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, body.as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::Membership;
    use crate::proxy::slots::tests::{next, ready};

    #[test]
    fn the_rendering_follows_the_slots_not_the_order_given() {
        let m = next(&Membership::default(), &ready(&["a", "b", "c"]), 3, 1);
        let mut shuffled = m.backends.clone();
        shuffled.reverse();
        let (text, version) = render("ns/x", &m.backends, 1, "/f");
        assert_eq!(render("ns/x", &shuffled, 1, "/f").1, version);
        assert_eq!(version.len(), 16);
        assert!(
            text.starts_with(&format!("-- version {version}\n")),
            "{text}"
        );
        assert!(text.contains("dist = mcp.dist_jump_hash"), "{text}");
        let order: Vec<usize> = ["\"a\"", "\"b\"", "\"c\""]
            .iter()
            .filter_map(|label| text.find(&format!("label = {label}")))
            .collect();
        assert!(order.len() == 3 && order.is_sorted(), "slot order: {text}");
        // Another address is another configuration.
        let mut other = m.backends.clone();
        other[0].address = "10.9.9.9:11211".into();
        assert_ne!(render("ns/x", &other, 1, "/f").1, version);
        // A vacant slot keeps its place, down.
        let gone = next(&m, &ready(&["a", "c"]), 3, 1);
        let (text, _) = render("ns/x", &gone.backends, 1, "/f");
        let vacant = text.find("label = \"vacant:1:1\"").unwrap_or_default();
        assert!(
            text.find("label = \"a\"") < Some(vacant) && Some(vacant) < text.find("label = \"c\""),
            "{text}"
        );
        assert!(text.contains("\"vacant:1:1\", host = \"127.0.0.1\", port = \"1\", down = true"));
    }

    /// A slot warming up: the predecessor sits at that slot's position of a `warm` ring of
    /// the same length, the other positions down; `get` and `mg` go through the warm-up
    /// route, the other reads straight to the pool, writes to both. A grown ring warms
    /// from the previous one, shorter. Without a pod in `warm` (or with two copies) the
    /// text is exactly the plain rendering.
    #[test]
    fn a_slot_warms_up_from_its_predecessor() {
        let m = next(&Membership::default(), &ready(&["a", "b", "c"]), 3, 1);
        let old = ProxyBackend {
            zone: None,
            copy: 1,
            slot: 1,
            pod: "old-b".into(),
            address: "10.0.0.9:11211".into(),
            warm_from: None,
            grown_from: None,
        };
        let plain = render("ns/x", &m.backends, 1, "/f");
        // The current ring, the old pod in slot 1, the other slots vacant.
        let vacant = |slot| ProxyBackend {
            slot,
            pod: String::new(),
            address: String::new(),
            ..old.clone()
        };
        let (text, version) = render_warm(
            "ns/x",
            &m.backends,
            &[vacant(0), old.clone(), vacant(2)],
            None,
            1,
            None,
            "/f",
        );
        assert_ne!(version, plain.1);
        let warm = text
            .find("    warm = {")
            .unwrap_or_else(|| panic!("{text}"));
        let ring = &text[warm..text[warm..].find("    },").map_or(text.len(), |e| warm + e)];
        let positions: Vec<usize> = [
            "label = \"cold:1:0\"",
            "label = \"old-b\", host = \"10.0.0.9\", port = \"11211\"",
            "label = \"cold:1:2\"",
        ]
        .iter()
        .map(|l| ring.find(l).unwrap_or_else(|| panic!("{l} in {ring}")))
        .collect();
        assert!(positions.is_sorted(), "{ring}");
        assert!(text.contains(
            "get = route_failover{ children = { route_warm and route_warm{ child = \"pool\", child_warm = \"warm\" } or route_direct{ child = \"pool\" }, route_null{} } }"
        ), "{text}");
        assert!(text.contains("mg = route_failover{ children = { route_warm and route_warm{ child = \"pool\", child_warm = \"warm\", meta = true } or route_direct{ child = \"pool\" }"), "{text}");
        assert!(
            text.contains("gets = route_failover{ children = { route_direct{ child = \"pool\" }"),
            "{text}"
        );
        assert!(
            text.contains("default = route_split{ child_a = \"pool\", child_b = \"warm\" }"),
            "{text}"
        );
        for unused in [
            vec![],
            vec![vacant(0), vacant(1), vacant(2)],
            vec![ProxyBackend {
                copy: 2,
                ..old.clone()
            }],
        ] {
            assert_eq!(
                render_warm("ns/x", &m.backends, &unused, None, 1, None, "/f"),
                plain
            );
        }
        // 2 slots grown to 3: the previous ring, both pods in their places, 2 long.
        let before = next(&Membership::default(), &ready(&["a", "b"]), 2, 1);
        let (text, _) = render_warm(
            "ns/x",
            &m.backends,
            &before.backends,
            Some(2),
            1,
            None,
            "/f",
        );
        let warm = &text[text
            .find("    warm = {")
            .unwrap_or_else(|| panic!("{text}"))..];
        let warm = &warm[..warm.find("    },").unwrap_or(warm.len())];
        assert_eq!(warm.matches("label = ").count(), 2, "{warm}");
        assert!(
            warm.find("label = \"a\"") < warm.find("label = \"b\"") && !warm.contains("cold"),
            "{warm}"
        );
        // Only the keys of slot 2 moved: a ring of 3 with slot 2 down tells them apart, and
        // only those are read from the previous ring and written to it.
        let unmoved = &text[text
            .find("    unmoved = {")
            .unwrap_or_else(|| panic!("{text}"))..];
        let unmoved = &unmoved[..unmoved.find("    },").unwrap_or(unmoved.len())];
        assert!(
            unmoved.find("label = \"a\"") < unmoved.find("label = \"b\"")
                && unmoved.contains(
                    "{ label = \"moved:1:2\", host = \"127.0.0.1\", port = \"1\", down = true },\n"
                )
                && !unmoved.contains("label = \"c\""),
            "{unmoved}"
        );
        assert!(
            text.contains("get = route_failover{ children = { route_warm and route_warm{ child = \"pool\", child_warm = \"warm\", child_unmoved = \"unmoved\" } or route_direct{ child = \"pool\" }, route_null{} } },"),
            "{text}"
        );
        assert!(
            text.contains("default = route_warm_write and route_warm_write{ child = \"pool\", child_warm = \"warm\", child_unmoved = \"unmoved\" } or route_direct{ child = \"pool\" },"),
            "{text}"
        );
        assert!(!text.contains("route_split"), "{text}");
        // A previous ring as long as the ring: nothing moved, nothing to warm.
        assert_eq!(
            render_warm("ns/x", &m.backends, &m.backends, Some(3), 1, None, "/f"),
            plain
        );
        let two = next(&Membership::default(), &ready(&["a", "b", "c", "d"]), 2, 2);
        assert_eq!(
            render_warm("ns/x", &two.backends, &[old], None, 2, None, "/f"),
            render("ns/x", &two.backends, 2, "/f")
        );
    }

    /// With a gutter, reads and writes go through the gutter route: reads in mode "read"
    /// before the null route, stores (with the gutter's TTL) and changes in their modes,
    /// meta commands marked; each falls back to the plain route in a proxy without the
    /// start file. The commands that set a TTL of their own never reach it, and two
    /// copies have no gutter.
    #[test]
    fn a_failed_pods_requests_go_on_to_the_gutter() {
        let m = next(&Membership::default(), &ready(&["a", "b", "c"]), 3, 1);
        let plain = render("ns/x", &m.backends, 1, "/f");
        let (text, version) = render_warm("ns/x", &m.backends, &[], None, 1, Some(7), "/f");
        assert_ne!(version, plain.1);
        let line = |command: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(&format!("{command} = ")))
                .unwrap_or_else(|| panic!("no route for {command}: {text}"))
                .trim()
                .to_string()
        };
        let pool = "route_direct{ child = \"pool\" }";
        let gutter = |mode: &str, meta: &str| {
            format!(
                "route_gutter and route_gutter{{ child = {pool}, child_gutter = \"internal\", mode = \"{mode}\", ttl = 7{meta} }} or ({pool})"
            )
        };
        for (read, meta) in [("get", ""), ("gets", ""), ("mg", ", meta = true")] {
            assert_eq!(
                line(read),
                format!(
                    "{read} = route_failover{{ children = {{ {}, route_null{{}} }} }},",
                    gutter("read", meta)
                )
            );
        }
        for read in ["gat", "gats"] {
            assert!(!line(read).contains("gutter"), "{text}");
        }
        for store in ["set", "add", "cas", "replace"] {
            assert_eq!(line(store), format!("{store} = {},", gutter("store", "")));
        }
        assert_eq!(
            line("ms"),
            format!("ms = {},", gutter("store", ", meta = true"))
        );
        for change in ["delete", "incr", "decr", "append", "prepend"] {
            assert_eq!(
                line(change),
                format!("{change} = {},", gutter("change", ""))
            );
        }
        for change in ["md", "ma"] {
            assert_eq!(
                line(change),
                format!("{change} = {},", gutter("change", ", meta = true"))
            );
        }
        assert!(
            !text.contains("touch = "),
            "touch goes by the default route: {text}"
        );
        assert!(text.contains(&format!("default = {pool},")), "{text}");
        // Warming too: the gutter behind the warm-up reads and the writes to both pods.
        let old = ProxyBackend {
            zone: None,
            copy: 1,
            slot: 0,
            pod: "old-a".into(),
            address: "10.0.0.9:11211".into(),
            warm_from: None,
            grown_from: None,
        };
        let (text, _) = render_warm("ns/x", &m.backends, &[old], None, 1, Some(7), "/f");
        assert!(text.contains("get = route_failover{ children = { route_gutter and route_gutter{ child = route_warm and route_warm{ child = \"pool\", child_warm = \"warm\" } or route_direct{ child = \"pool\" }, child_gutter"), "{text}");
        assert!(text.contains("set = route_gutter and route_gutter{ child = route_split{ child_a = \"pool\", child_b = \"warm\" }, child_gutter = \"internal\", mode = \"store\", ttl = 7 } or (route_split{ child_a = \"pool\", child_b = \"warm\" }),"), "{text}");
        // Two copies: no gutter.
        let two = next(&Membership::default(), &ready(&["a", "b", "c", "d"]), 2, 2);
        assert_eq!(
            render_warm("ns/x", &two.backends, &[], None, 2, Some(7), "/f"),
            render("ns/x", &two.backends, 2, "/f")
        );
    }

    /// With zones, the copies are one pool set keyed by zone; reads ask the proxy pod's own
    /// zone first (read from its environment, passed to the route) and shuffle only
    /// without one; writes go to every zone. Copies without zones render as before.
    #[test]
    fn zoned_copies_are_read_from_the_proxys_own_zone_first() {
        let mut m = next(
            &Membership::default(),
            &ready(&["a", "b", "c", "d", "e", "f"]),
            6,
            3,
        );
        let plain = render("ns/x", &m.backends, 3, "/f");
        assert!(
            plain.0.contains("set_copies") && !plain.0.contains("zone"),
            "{}",
            plain.0
        );
        for b in &mut m.backends {
            b.zone = Some(["eu-1a", "eu-1b", "eu-1c"][(b.copy - 1) as usize].to_string());
        }
        let (text, version) = render("ns/x", &m.backends, 3, "/f");
        assert_ne!(version, plain.1);
        for zone in ["eu-1a", "eu-1b", "eu-1c"] {
            assert_eq!(
                text.matches(&format!("        [\"{zone}\"] = {{\n"))
                    .count(),
                1,
                "{text}"
            );
        }
        assert!(
            text.contains("local zone = os.getenv(\"MEMCACHED_PROXY_ZONE\")\nif ({ [\"eu-1a\"] = true, [\"eu-1b\"] = true, [\"eu-1c\"] = true })[zone or \"\"] == nil then zone = nil end\nroutes{"),
            "{text}"
        );
        for read in ["get", "gets", "gat", "gats", "mg"] {
            assert!(
                text.contains(&format!("        {read} = route_failover{{ children = {{ route_failover{{ children = \"set_zones\", miss = true, local_zone = zone, shuffle = zone == nil }}, route_null{{}} }} }},\n")),
                "{read}: {text}"
            );
        }
        assert!(
            text.contains("default = route_allfastest{ children = \"set_zones\" },"),
            "{text}"
        );
        assert!(!text.contains("set_copies"), "{text}");
        // A zone missing on one copy, or one zone twice: plain copies.
        let mut partial = m.backends.clone();
        partial
            .iter_mut()
            .filter(|b| b.copy == 3)
            .for_each(|b| b.zone = None);
        assert_eq!(render("ns/x", &partial, 3, "/f"), plain);
    }

    #[test]
    fn lua_strings_are_escaped() {
        assert_eq!(lua_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\010\"");
    }
}
