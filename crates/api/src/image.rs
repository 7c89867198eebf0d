//! Container image references, `[registry[:port]/]path[:tag][@digest]`: the parser the
//! validation of every image field uses ([`ImageReference::parse`]) and the looser pattern
//! the CRD schema carries ([`IMAGE_PATTERN`]).
//!
//! The grammar is the distribution project's (github.com/distribution/reference), which
//! containerd, CRI-O and Docker share; nothing here is specific to Memcached.

use std::fmt;

/// Longest `spec.image` accepted (also in the CRD schema).
pub const MAX_IMAGE_LENGTH: usize = 512;
/// Longest image name (registry and path, without tag or digest), as in the distribution
/// project's reference grammar.
pub const MAX_IMAGE_NAME_LENGTH: usize = 255;
/// Longest image tag.
pub const MAX_TAG_LENGTH: usize = 128;

/// The image reference grammar of the distribution project (`docker pull`, containerd,
/// kubelet) as one anchored regular expression, put on `spec.image` in the CRD schema so a
/// cluster without the webhook still rejects what can never be pulled (whitespace, a URL
/// scheme, an uppercase repository, a bad tag or digest):
/// `[host[:port]/]path[:tag][@algorithm:hex]`. It is a net, not the whole rule: the
/// webhook and the reconciler use [`ImageReference::parse`], which is stricter
/// (known digest algorithms and lengths, the 255-character name limit, ports in range).
/// Written for RE2 (Kubernetes) and Rust's `regex` alike: no `\w`, no look-around.
pub const IMAGE_PATTERN: &str = concat!(
    "^",
    // optional registry: host (DNS name or [IPv6]) with an optional port, then '/'
    r"(?:(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])",
    r"(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*",
    r"|\[[a-fA-F0-9:]+\])(?::[0-9]+)?/)?",
    // repository path: lowercase components separated by '/'
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*",
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*",
    // optional tag
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?",
    // optional digest
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    "$"
);

/// A parsed container image reference, `[domain/]path[:tag][@digest]`, following the
/// grammar of the distribution project (github.com/distribution/reference), which
/// containerd, CRI-O and Docker share:
///
/// ```text
/// reference        := name [ ":" tag ] [ "@" digest ]
/// name             := [domain '/'] path-component ['/' path-component]*
/// domain           := host [':' port-number]
/// host             := domain-name | '[' IPv6address ']'
/// domain-name      := domain-component ['.' domain-component]*
/// domain-component := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
/// path-component   := alpha-numeric [separator alpha-numeric]*
/// alpha-numeric    := /[a-z0-9]+/
/// separator        := /[_.]|__|[-]+/
/// tag              := /[\w][\w.-]{0,127}/
/// digest           := algorithm ":" hex
/// algorithm        := /[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*/
/// hex              := /[0-9a-fA-F]{32,}/
/// ```
///
/// As in Docker, the first component is the registry when it contains `.` or `:`, is
/// `localhost`, or has an uppercase letter. The name is at most 255 characters, and digests
/// of the algorithms runtimes support (sha256, sha384, sha512) must have their exact
/// length in lowercase hex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageReference {
    /// Registry host with optional port (`registry.example.com:5000`), if given.
    pub domain: Option<String>,
    /// Repository path (`team/memcached`).
    pub path: String,
    /// Tag (`1.6.39-alpine`), if given.
    pub tag: Option<String>,
    /// Digest (`sha256:<64 hex>`), if given.
    pub digest: Option<String>,
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(domain) = &self.domain {
            write!(f, "{domain}/")?;
        }
        f.write_str(&self.path)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl ImageReference {
    /// Parses `image`; the error says what is wrong, readable by a person.
    pub fn parse(image: &str) -> Result<Self, String> {
        if image.is_empty() {
            return Err("must not be empty (omit the field to use the operator's default)".into());
        }
        if image.len() > MAX_IMAGE_LENGTH {
            return Err(format!(
                "must be no more than {MAX_IMAGE_LENGTH} characters (is {})",
                image.len()
            ));
        }
        if image.chars().any(char::is_whitespace) {
            return Err("is not a valid image reference: it contains whitespace".into());
        }
        if image.chars().any(char::is_control) {
            return Err("is not a valid image reference: it contains control characters".into());
        }
        if image.contains("://") {
            return Err(
                "is not a valid image reference: drop the URL scheme (an image is [registry[:port]/]path[:tag][@digest])"
                    .into(),
            );
        }
        if !image.is_ascii() {
            return Err("is not a valid image reference: only ASCII characters are allowed".into());
        }
        let (rest, digest) = match image.split_once('@') {
            Some((rest, digest)) => {
                parse_digest(digest)?;
                (rest, Some(digest.to_string()))
            }
            None => (image, None),
        };
        // A ':' after the last '/' starts the tag; one before it belongs to a registry port.
        let last_slash = rest.rfind('/');
        let (name, tag) = match rest.rfind(':') {
            Some(colon) if last_slash.is_none_or(|slash| colon > slash) => {
                let tag = &rest[colon + 1..];
                parse_tag(tag)?;
                (&rest[..colon], Some(tag.to_string()))
            }
            _ => (rest, None),
        };
        if name.is_empty() {
            return Err("is not a valid image reference: the repository name is missing".into());
        }
        if name.len() > MAX_IMAGE_NAME_LENGTH {
            return Err(format!(
                "is not a valid image reference: the repository name must be no more than {MAX_IMAGE_NAME_LENGTH} characters (is {})",
                name.len()
            ));
        }
        let (domain, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains(['.', ':'])
                    || first == "localhost"
                    || first.chars().any(|c| c.is_ascii_uppercase()) =>
            {
                parse_domain(first)?;
                (Some(first.to_string()), path)
            }
            _ => (None, name),
        };
        for component in path.split('/') {
            parse_path_component(component)?;
        }
        if domain.is_none() && path.len() == 64 && path.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(
                "is not a valid image reference: a repository name may not be a 64-character hexadecimal string (that is an image ID)"
                    .into(),
            );
        }
        Ok(Self {
            domain,
            path: path.to_string(),
            tag,
            digest,
        })
    }
}

fn parse_digest(digest: &str) -> Result<(), String> {
    let bad = |why: String| {
        Err(format!(
            "is not a valid image reference: digest {digest:?} {why}"
        ))
    };
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return bad("must be <algorithm>:<hex>, e.g. sha256:<64 hex digits>".into());
    };
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.split(['-', '_', '+', '.']).all(|c| {
            let mut chars = c.chars();
            chars.next().is_some_and(|f| f.is_ascii_alphabetic())
                && chars.all(|ch| ch.is_ascii_alphanumeric())
        });
    if !algorithm_ok {
        return bad(format!(
            "has an invalid algorithm {algorithm:?} (letters and digits, starting with a letter)"
        ));
    }
    if hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return bad("must end in at least 32 hexadecimal digits".into());
    }
    let want = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        other => {
            return bad(format!(
                "uses the unsupported algorithm {other:?} (supported: sha256, sha384, sha512)"
            ));
        }
    };
    if hex.len() != want {
        return bad(format!(
            "must have {want} hexadecimal digits for {algorithm} (has {})",
            hex.len()
        ));
    }
    if hex.bytes().any(|b| b.is_ascii_uppercase()) {
        return bad("must be in lowercase hexadecimal".into());
    }
    Ok(())
}

fn parse_tag(tag: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("is not a valid image reference: tag {tag:?} {why}"));
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    match bytes.first() {
        None => bad("is empty (drop the ':' or name a tag)"),
        Some(&first) if !word(first) => bad("must start with a letter, digit or '_'"),
        Some(_) if bytes.len() > MAX_TAG_LENGTH => bad(&format!(
            "must be no more than {MAX_TAG_LENGTH} characters (is {})",
            bytes.len()
        )),
        Some(_) if !bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-') => {
            bad("may contain only letters, digits, '_', '.' and '-'")
        }
        Some(_) => Ok(()),
    }
}

fn parse_domain(domain: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "is not a valid image reference: registry {domain:?} {why}"
        ))
    };
    let port = if let Some(rest) = domain.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else {
            return bad("has an unclosed '[' around an IPv6 address");
        };
        if ip.is_empty() || !ip.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return bad("has an invalid IPv6 address");
        }
        match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return bad("has characters after the IPv6 address"),
            },
        }
    } else {
        let (host, port) = match domain.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (domain, None),
        };
        let component_ok = |c: &str| {
            let b = c.as_bytes();
            !b.is_empty()
                && b.iter().all(|&x| x.is_ascii_alphanumeric() || x == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        };
        if !host.split('.').all(component_ok) {
            return bad(
                "must be a host name (letters, digits and '-' in dot-separated parts) or [IPv6 address], with an optional :port",
            );
        }
        port
    };
    if let Some(port) = port
        && (port.is_empty()
            || !port.bytes().all(|b| b.is_ascii_digit())
            || port
                .parse::<u32>()
                .map_or(true, |p| !(1..=65535).contains(&p)))
    {
        return bad("has a port that is not a number between 1 and 65535");
    }
    Ok(())
}

fn parse_path_component(component: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "is not a valid image reference: repository path component {component:?} {why}"
        ))
    };
    if component.is_empty() {
        return bad("is empty (no leading, trailing or doubled '/')");
    }
    if component.bytes().any(|b| b.is_ascii_uppercase()) {
        return bad("must be lowercase");
    }
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !bytes
        .iter()
        .all(|&b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
    {
        return bad(
            "may contain only lowercase letters, digits and the separators '.', '_', '__' and '-'",
        );
    }
    if !bytes.first().is_some_and(|&b| alnum(b)) || !bytes.last().is_some_and(|&b| alnum(b)) {
        return bad("must start and end with a lowercase letter or digit");
    }
    // Separators between alphanumeric runs: one '.', one '_', "__", or any number of '-'.
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &component[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return bad(&format!(
                "has the separator {sep:?}; allowed are '.', '_', '__' or a run of '-'"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn image_pattern_accepts_references_and_rejects_nonsense() {
        let re = regex::Regex::new(IMAGE_PATTERN).expect("pattern compiles");
        for good in [
            "memcached",
            "memcached:1.6.39-alpine",
            "library/memcached:latest",
            "registry.example.com:5000/team/memcached:1.6",
            "localhost/memcached",
            "[::1]:5000/memcached",
            "ghcr.io/a/b/c__d.e-f:V1_2.3-x",
            "memcached@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert!(re.is_match(good), "{good}");
        }
        for bad in [
            "",
            "memcached 1.6",
            " memcached",
            "memcached\n",
            "https://memcached",
            "Memcached",
            "team/Memcached",
            "memcached:",
            "memcached:-1",
            "memcached:1.6 ",
            "memcached@sha256:abc",
            "memcached@sha256",
            "memcached@@sha256:0123456789abcdef0123456789abcdef",
            "memcached:1.6@",
            "my..cache",
            "/memcached",
            "memcached/",
            "memcached:1:2",
        ] {
            assert!(!re.is_match(bad), "{bad:?}");
        }
    }

    #[test]
    fn image_references_parse_into_their_parts() {
        let r = ImageReference::parse(&format!(
            "registry.example.com:5000/team/memcached:1.6@sha256:{SHA}"
        ))
        .expect("parses");
        assert_eq!(r.domain.as_deref(), Some("registry.example.com:5000"));
        assert_eq!(r.path, "team/memcached");
        assert_eq!(r.tag.as_deref(), Some("1.6"));
        assert_eq!(r.digest, Some(format!("sha256:{SHA}")));
        let r = ImageReference::parse("memcached").expect("parses");
        assert_eq!((r.domain, r.tag, r.digest), (None, None, None));
        let r = ImageReference::parse("localhost:5000").expect("docker reads this as a tag");
        assert_eq!(
            (r.path.as_str(), r.tag.as_deref()),
            ("localhost", Some("5000"))
        );
        let r = ImageReference::parse("localhost/memcached").expect("parses");
        assert_eq!(r.domain.as_deref(), Some("localhost"));
        let r = ImageReference::parse("[fd00::1]:5000/memcached:1").expect("parses");
        assert_eq!(r.domain.as_deref(), Some("[fd00::1]:5000"));
        let r =
            ImageReference::parse("Registry/memcached").expect("uppercase first part is a host");
        assert_eq!(r.domain.as_deref(), Some("Registry"));
        for good in [
            "a",
            "a_b__c-d---e/f.g",
            "library/memcached:latest",
            "memcached:_x",
            &format!("memcached:{}", "t".repeat(128)),
            &format!("memcached@sha512:{}", "a".repeat(128)),
            &format!("memcached@sha384:{}", "a".repeat(96)),
        ] {
            let parsed = ImageReference::parse(good).unwrap_or_else(|e| panic!("{good}: {e}"));
            assert_eq!(parsed.to_string(), good, "round trip");
        }
    }

    #[test]
    fn bad_image_references_say_what_is_wrong() {
        for (bad, why) in [
            ("", "empty"),
            ("memcached 1.6", "whitespace"),
            ("memcached\t", "whitespace"),
            ("mem\u{7}cached", "control"),
            ("https://memcached", "scheme"),
            ("Memcached", "lowercase"),
            ("team/Memcached:1", "lowercase"),
            ("memcached:", "tag"),
            ("memcached:-x", "tag"),
            ("memcached:a+b", "tag"),
            (&format!("memcached:{}", "t".repeat(129)), "128"),
            ("memcached@sha256:abc", "digest"),
            ("memcached@sha256", "digest"),
            (
                "memcached@md5:0123456789abcdef0123456789abcdef",
                "unsupported",
            ),
            (
                &format!("memcached@sha256:{}", SHA.to_uppercase()),
                "lowercase",
            ),
            (&format!("memcached@sha256:{SHA}0"), "64"),
            ("my..cache", "separator"),
            ("my_-cache", "separator"),
            ("my___cache", "separator"),
            ("/memcached", "empty"),
            ("memcached/", "empty"),
            ("a//b", "empty"),
            ("-cache", "start"),
            ("registry.example.com:99999/memcached", "port"),
            ("registry.example.com:/memcached", "port"),
            ("bad_host.com/memcached", "host"),
            ("[zz::1]/memcached", "IPv6"),
            (SHA, "hexadecimal"),
            ("mémcached", "ASCII"),
            (&format!("{}/x", "a.".repeat(130)), "255"),
            (&"a".repeat(513), "512"),
            (":1.6", "missing"),
        ] {
            let err = ImageReference::parse(bad).expect_err(bad);
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        fn config() -> ProptestConfig {
            ProptestConfig {
                cases: 2000,
                failure_persistence: None,
                ..ProptestConfig::default()
            }
        }

        proptest! {
            #![proptest_config(config())]

            /// Anything: no panic; what parses prints back as itself and matches the
            /// schema pattern (the schema never rejects what the parser accepts).
            #[test]
            fn any_string(s in "\\PC{0,80}") {
                check(&s);
            }

            /// Reference-shaped strings, so the accepting paths are exercised too.
            #[test]
            fn reference_like(
                s in "([a-zA-Z0-9.:\\[\\]-]{1,12}/)?[a-zA-Z0-9._-]{1,12}(/[a-z0-9._-]{1,8})?(:[a-zA-Z0-9._+-]{0,10})?(@(sha256|sha512|md5|x)?:?[0-9a-fA-F]{0,70})?"
            ) {
                check(&s);
            }
        }

        fn check(s: &str) {
            let pattern = regex::Regex::new(crate::IMAGE_PATTERN).expect("pattern compiles");
            if let Ok(r) = ImageReference::parse(s) {
                assert_eq!(r.to_string(), s);
                assert!(
                    pattern.is_match(s),
                    "parser accepts but schema rejects {s:?}"
                );
            }
        }
    }
}
